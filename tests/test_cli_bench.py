"""``oxillama bench``: llama-bench's tests and tables on SmolLM2, checked
against what llama-bench itself prints for the same file
(tests/reference/llama_bench.json, made by make_llama_bench_reference.py)."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from oxillama.cli import bench
from oxillama.cli.main import main
from oxillama.engine.engine import Engine

REF = json.loads((Path(__file__).parent / "reference" / "llama_bench.json").read_text("utf-8"))
SMOL = REF["models"]["smollm2"]
TINY = ["-p", "8", "-n", "4", "-r", "2", "-t", "1,2"]
# llama-bench's order: by thread count, then the pp tests, then the tg tests.
EXPECTED = [(1, 8, 0), (1, 0, 4), (2, 8, 0), (2, 0, 4)]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, str]:
    assert main(["bench", *args]) == 0
    out = capsys.readouterr()
    return out.out, out.err


def test_markdown_is_llama_benchs_table(
    model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, err = run(capsys, "-m", str(model_path), *TINY, "--pool-stats")
    lines = out.splitlines()
    assert lines[:2] == REF["md_header"]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:6]]
    assert lines[6] == "" and lines[7].startswith("build: oxillama ")
    for line in lines[2:6]:  # the same column widths as the header
        assert [len(c) for c in line.split("|")] == [len(c) for c in lines[0].split("|")]
    for row, (threads, pp, tg) in zip(rows, EXPECTED, strict=True):
        model, size, params, backend, n_threads, test, ts = row
        assert (model, size, params) == (SMOL["md_model"], SMOL["md_size"], SMOL["md_params"])
        assert backend == "CPU" and n_threads == str(threads)
        assert test == (f"pp{pp}" if pp else f"tg{tg}")
        m = re.fullmatch(r"(\d+\.\d\d) ± (\d+\.\d\d)", ts)
        assert m is not None and float(m[1]) > 0 and float(m[2]) >= 0
    # The CPU on standard error, and a progress line per step.
    assert "oxillama bench: CPU: " in err and "physical cores" in err
    assert "4/4 tg4, 2 threads: run 2/2" in err
    # And, asked for, after each test how the pool spent its timed runs.
    pools = re.findall(r"(\d)/4 \w+, (\d) threads: pool: (\d+)% of the time in (\d+) "
                       r"dispatches, \d threads? busy (\d+)% of it", err)  # fmt: skip
    assert [(int(i), int(t)) for i, t, *_ in pools] == [(1, 1), (2, 1), (3, 2), (4, 2)]
    for _, _, inside, n, busy in pools:
        assert 0 < int(inside) <= 100 and int(n) > 0 and 0 < int(busy) <= 100


def test_pool_line_reads_the_counters_difference() -> None:
    before, after = (10, 1.0, 1.5, 2), (30, 1.8, 3.1, 2)
    assert bench.pool_line(before, after, 1.0) == (
        "pool: 80% of the time in 20 dispatches, 2 threads busy 100% of it"
    )
    assert bench.pool_line(after, after, 1.0) == "pool: no dispatches"


def _check_record(r: dict[str, Any], threads: int, pp: int, tg: int, reps: int) -> None:
    assert r["model_type"] == SMOL["model_type"]
    assert r["model_size"] == SMOL["model_size"]
    assert r["model_n_params"] == SMOL["model_n_params"]
    assert (r["n_threads"], r["n_prompt"], r["n_gen"], r["n_depth"]) == (threads, pp, tg, 0)
    assert r["backends"] == "CPU" and r["cpu_info"] == bench.cpu_name()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["test_time"])
    ns, ts = r["samples_ns"], r["samples_ts"]
    assert len(ns) == len(ts) == reps and all(t > 0 for t in ns)
    # t/s is the mean of each run's (prompt + generated) / seconds.
    assert ts == pytest.approx([1e9 * (pp + tg) / t for t in ns])
    assert r["avg_ts"] == pytest.approx(sum(ts) / reps) and r["avg_ts"] > 0
    assert r["avg_ns"] == pytest.approx(sum(ns) / reps, abs=1)
    assert r["stddev_ts"] >= 0 and r["stddev_ns"] >= 0


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_json_carries_llama_benchs_fields(
    fmt: str, model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, err = run(capsys, "-m", str(model_path), *TINY, "-o", fmt)
    assert "pool:" not in err  # counted only when asked for
    records = json.loads(out) if fmt == "json" else [json.loads(x) for x in out.splitlines()]
    assert len(records) == 4
    for r, (threads, pp, tg) in zip(records, EXPECTED, strict=True):
        # Every field is one of llama-bench's, in its order.
        fields = [f for f in REF["json_fields"] if f in r]
        assert list(r) == fields
        assert {"model_filename", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts"} <= set(r)
        assert r["model_filename"] == str(model_path)
        _check_record(r, threads, pp, tg, reps=2)


def test_csv_has_a_header_and_quoted_values(
    model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = run(capsys, "-m", str(model_path), *TINY, "-o", "csv")
    header, *rows = out.splitlines()
    assert header.split(",") == [f for f in REF["json_fields"] if f in bench.FIELDS]
    assert all(line.startswith('"') for line in rows)
    records = list(csv.DictReader(io.StringIO(out)))
    assert len(records) == 4
    for r, (threads, pp, tg) in zip(records, EXPECTED, strict=True):
        assert r["model_type"] == SMOL["model_type"]
        assert (int(r["n_threads"]), int(r["n_prompt"]), int(r["n_gen"])) == (threads, pp, tg)
        assert float(r["avg_ts"]) > 0


def test_depth_prompts_and_generation_feed_the_engine_like_llama_bench(
    model_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """pp: one call of N tokens; tg: N calls of one token; the depth is
    filled once, untimed, and each timed run starts on exactly that depth;
    the warm-up is a full prompt or a single generated token, from empty."""
    calls: list[tuple[int, int]] = []
    real_eval = Engine.eval

    def spy(self: Engine, tokens: Any, **kw: Any) -> Any:
        calls.append((self.n_past, len(tokens)))
        return real_eval(self, tokens, **kw)

    monkeypatch.setattr(Engine, "eval", spy)
    out, _ = run(capsys, "-m", str(model_path), "-p", "8", "-n", "3", "-d", "16", "-r", "2",
                 "-t", "1")  # fmt: skip
    tests = [line.split("|")[6].strip() for line in out.splitlines()[2:4]]
    assert tests == ["pp8 @ d16", "tg3 @ d16"]
    pp = [(0, 8), (0, 16), (16, 8), (16, 8)]
    tg = [(0, 1), (0, 16)] + [(16, 1), (17, 1), (18, 1)] * 2
    assert calls == pp + tg


def test_lists_ranges_defaults_and_errors(
    model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.int_list("1,2,8-32*2") == [1, 2, 8, 16, 32]
    assert bench.int_list("1-5+2") == [1, 3, 5]
    assert bench.int_list("512") == [512]
    out, _ = run(capsys, "-m", f"{model_path},{model_path}", "-p", "4", "-n", "0",
                 "-pg", "4,2", "-r", "1", "-t", "1", "-o", "jsonl")  # fmt: skip
    rows = [json.loads(x) for x in out.splitlines()]
    assert [(r["n_prompt"], r["n_gen"]) for r in rows] == [(4, 0), (4, 2)] * 2
    assert main(["bench", "-m", str(model_path), "-p", "0", "-n", "0"]) == 2
    assert "nothing to run" in capsys.readouterr().err
    assert main(["bench", "-m", str(model_path / "missing.gguf")]) == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "-t", "1-4*1"])
    assert exit_.value.code == 2 and "does not advance" in capsys.readouterr().err


def test_home_in_a_comma_list_is_expanded(
    model_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shell expands only the first path of ``-m a,~/b``: the rest
    reach the tool with their ``~``, and must find the same file."""
    monkeypatch.setenv("HOME", str(model_path.parent))
    out, _ = run(capsys, "-m", f"~/{model_path.name},~/{model_path.name}", "-p", "4",
                 "-n", "0", "-r", "1", "-t", "1", "-o", "jsonl")  # fmt: skip
    rows = [json.loads(x) for x in out.splitlines()]
    assert [r["model_filename"] for r in rows] == [str(model_path)] * 2


def test_help_teaches(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    for word in ("llama-bench", "-p 512 -n 128", "@ dN", "warm-up", "-o json", "examples"):
        assert word in text


def test_cache_types_reach_the_engine_and_the_records(
    model_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """-ctk/-ctv as llama-bench's: the engine runs with those KV types and
    each record names them; an unknown type fails before any test runs."""
    from oxillama.engine import engine as engine_mod

    seen: list[tuple[str | None, str | None]] = []
    real = engine_mod.Engine.__init__

    def spy(self: Any, *a: Any, **kw: Any) -> None:
        seen.append((kw.get("kv_dtype_k"), kw.get("kv_dtype_v")))
        real(self, *a, **kw)

    monkeypatch.setattr(engine_mod.Engine, "__init__", spy)
    out, _ = run(
        capsys,
        "-m",
        str(model_path),
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "1",
        "-t",
        "1",
        "-ctk",
        "q8_0",
        "-ctv",
        "q4_0",
        "-o",
        "jsonl",
    )
    recs = [json.loads(line) for line in out.splitlines()]
    assert [(r["type_k"], r["type_v"]) for r in recs] == [("q8_0", "q4_0")] * 2
    assert seen == [("q8_0", "q4_0")] * 2
    assert main(["bench", "-m", str(model_path), "-p", "8", "-n", "0", "-ctk", "q9"]) != 0
    assert "unknown KV cache type 'q9'" in capsys.readouterr().err
