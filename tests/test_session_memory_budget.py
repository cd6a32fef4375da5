"""The server's bound on the KV memory of live sessions (--max-session-memory):
past it the least recently used idle sessions are hibernated (or, without a
sessions folder, evicted) until the live ones fit, so a quantized KV cache
keeps more sessions live in the same bytes; hibernated sessions continue
exactly; a session in a turn is never picked, and one that alone is larger
than the bound leaves once idle; the flag reads sizes and refuses others."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from oxillama import AsyncEngine, OxiLlamaError, ParameterError, SamplerConfig
from oxillama.cli.main import main
from oxillama.serving.flags import serve_options_from_mapping
from oxillama.serving.http import Limits
from oxillama.serving.http.api_error import ApiError
from oxillama.serving.http.limits import parse_size
from oxillama.serving.http.session_table import SessionTable
from tests._serve import serving

#: About 60 tokens, so a session holds a handful of pages.
PROMPT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, "
    "carrying a lantern, a flask of tea and a notebook in which he wrote down "
    "the ships he saw, the weather, and the colour of the sea."
)
GREEDY = SamplerConfig.greedy()


def engine(model_path: Path, kv: str) -> AsyncEngine:
    return AsyncEngine(
        model_path,
        context_size=512,
        threads=2,
        max_batch=4,
        kv_pages=256,
        kv_dtype_k=kv,
        kv_dtype_v=kv,
        sampler=GREEDY,
    )


def table(eng: AsyncEngine, folder: Path | None, budget: int | None) -> SessionTable:
    return SessionTable(
        eng, max_sessions=64, folder=folder, remembered_evictions=100, max_kv_bytes=budget
    )


async def turn(t: SessionTable, sid: str, prompt: str, n: int = 6) -> list[int]:
    lease = await t.lease(sid)
    try:
        out = await lease.session.generate(prompt, n, ignore_eos=True)
    finally:
        lease.release()
    await t.settled()
    return out.tokens


async def one_session_bytes(eng: AsyncEngine) -> int:
    """KV bytes of a session after one turn of PROMPT (a session outside
    any table, closed afterwards)."""
    s = eng.session()
    await s.generate(PROMPT, 6, ignore_eos=True)
    page = int(eng.metrics()["kv_page_bytes"])
    n = await asyncio.wrap_future(eng.scheduler.call(lambda: s._kv_bytes(page)))
    await s.close()
    return int(n)


async def _bytes(model_path: Path, kv: str) -> int:
    eng = engine(model_path, kv)
    try:
        return await one_session_bytes(eng)
    finally:
        await eng.close()


def test_the_same_budget_keeps_more_sessions_live_at_q4_0_than_at_f16(
    model_path: Path, tmp_path: Path
) -> None:
    n = 14

    async def run(kv: str, budget: int) -> tuple[int, int, int, int]:
        eng = engine(model_path, kv)
        try:
            per_session = await one_session_bytes(eng)
            (tmp_path / kv).mkdir()
            t = table(eng, tmp_path / kv, budget)
            for i in range(n):
                await turn(t, f"s{i}", PROMPT)
                assert t.kv_bytes <= budget
            live, on_disk, held = t.n_live, t.n_on_disk, t.kv_bytes
            await t.close()
            return per_session, live, on_disk, held
        finally:
            await eng.close()

    async def both() -> tuple[int, tuple[int, int, int, int], tuple[int, int, int, int]]:
        f16 = await _bytes(model_path, "f16")
        budget = 3 * f16 + f16 // 2  # room for three and a half f16 sessions
        return budget, await run("f16", budget), await run("q4_0", budget)

    budget, f16, q4 = asyncio.run(both())
    # The same pages hold the same positions: q4_0's rows are 18 bytes per
    # 32 elements where f16's are 64.
    assert q4[0] * 64 == f16[0] * 18
    for per_session, live, on_disk, held in (f16, q4):
        # Every session of the same prompt is the same size: as many stay
        # as fit, the rest went to the folder.
        assert live == min(n, budget // per_session)
        assert on_disk == n - live
        assert held == live * per_session <= budget
    assert f16[1] == 3
    assert q4[1] >= 3 * f16[1]


@pytest.mark.parametrize("kv", ["f16", "q4_0"])
def test_hibernated_sessions_continue_exactly_after_restore(
    model_path: Path, tmp_path: Path, kv: str
) -> None:
    async def run() -> tuple[list[list[int]], list[list[int]], int]:
        eng = engine(model_path, kv)
        try:
            per_session = await one_session_bytes(eng)
            # References: two turns back to back on sessions never bounded.
            want = []
            for k in range(3):
                ref = eng.session()
                await ref.generate(f"{PROMPT} ({k})", 6, ignore_eos=True)
                want.append((await ref.generate(" And then", 8, ignore_eos=True)).tokens)
                await ref.close()
            t = table(eng, tmp_path, 2 * per_session)
            for k in range(3):
                await turn(t, f"s{k}", f"{PROMPT} ({k})")
            # Two fit: s0 went to the folder. Each second turn restores the
            # session it names and pushes the least recently used one out.
            assert t.n_live == 2 and (tmp_path / "s0.oxisnap").is_file()
            got = [await turn(t, f"s{k}", " And then", 8) for k in range(3)]
            wakes = t.counts.restores["wake"]
            await t.close()
            return want, got, wakes
        finally:
            await eng.close()

    want, got, wakes = asyncio.run(run())
    assert got == want
    assert wakes >= 3


def test_a_session_larger_than_the_budget_stays_in_its_turn_and_leaves_when_idle(
    model_path: Path, tmp_path: Path
) -> None:
    async def run() -> None:
        eng = engine(model_path, "q4_0")
        try:
            small = await one_session_bytes(eng)
            ref = eng.session()
            await ref.generate(PROMPT, 48, ignore_eos=True)
            want = (await ref.generate(" Later,", 8, ignore_eos=True)).tokens
            await ref.close()
            t = table(eng, tmp_path, small)  # one small session fits, "big" never does
            lease = await t.lease("big")
            gen = asyncio.ensure_future(lease.session.generate(PROMPT, 48, ignore_eos=True))
            # Other turns end while "big" is in its turn: each fit leaves
            # "big" live however much it holds.
            await turn(t, "a", PROMPT)
            await turn(t, "b", PROMPT)
            assert "big" in t._live and not (tmp_path / "big.oxisnap").exists()
            await gen
            await t._fit_memory()  # a fit while the lease is still held
            assert "big" in t._live and t.kv_bytes > small
            lease.release()
            await t.settled()
            # Idle now: it alone is over the budget, so it went to the folder
            # ("a" and "b" each left after their turn: "big" held the budget).
            assert "big" not in t._live and (tmp_path / "big.oxisnap").is_file()
            assert t.n_live == 0 and t.kv_bytes == 0
            assert await turn(t, "big", " Later,", 8) == want
            assert t.counts.restores["wake"] == 1
            await t.close()
        finally:
            await eng.close()

    asyncio.run(run())


def test_without_a_folder_sessions_past_the_budget_are_evicted_saying_why(
    model_path: Path,
) -> None:
    async def run() -> ApiError:
        eng = engine(model_path, "f16")
        try:
            per_session = await one_session_bytes(eng)
            t = table(eng, None, per_session + per_session // 2)
            await turn(t, "old", PROMPT)
            await turn(t, "new", PROMPT)
            assert t.n_live == 1 and t.counts.evicted == 1
            with pytest.raises(ApiError) as e:
                await t.lease("old")
            await t.close()
            return e.value
        finally:
            await eng.close()

    err = asyncio.run(run())
    assert err.status == 404 and err.code == "session_evicted"
    assert "of KV cache together" in err.message and "--max-session-memory" in err.message


def _metrics(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    pairs = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {k.removeprefix("oxillama:"): float(v) for k, v in pairs}


def _post(url: str, body: dict[str, Any]) -> str:
    req = urllib.request.Request(
        url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return str(json.loads(r.read())["choices"][0]["text"])


def test_the_server_holds_the_budget_and_reports_it(model_path: Path, tmp_path: Path) -> None:
    per_session = asyncio.run(_bytes(model_path, "q8_0"))
    budget = 2 * per_session
    eng = engine(model_path, "q8_0")
    body = {"prompt": PROMPT, "max_tokens": 6, "ignore_eos": True, "temperature": 0}
    limits = Limits(max_sessions=64, max_session_memory=budget)
    with serving(eng, "smollm2", sessions_dir=tmp_path, limits=limits) as url:
        for sid in ("h0", "h1", "h2", "h3"):
            _post(url, {**body, "session": sid})
        # The fit after each turn runs in the background: the last one is
        # done when the fourth session's arrival is undone.
        deadline = time.monotonic() + 30
        while True:
            m = _metrics(url)
            if m["sessions_live"] == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert m["sessions_max_kv_bytes"] == budget
        assert m["sessions_kv_bytes"] == 2 * per_session
        assert m["sessions_live"] == 2 and m["sessions_hibernated"] == 2
        assert m['session_saves_total{reason="hibernate"}'] == 2
        assert {p.name for p in tmp_path.iterdir()} == {"h0.oxisnap", "h1.oxisnap"}


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("1000", 1000),
        ("512M", 512 << 20),
        ("2G", 2 << 30),
        ("2g", 2 << 30),
        ("1.5G", 3 << 29),
        ("64KiB", 64 << 10),
        ("3MB", 3 << 20),
        (" 7K ", 7 << 10),
    ],
)
def test_sizes_are_read_in_bytes_or_binary_units(text: str, n: int) -> None:
    assert parse_size(text) == n
    spec, _ = serve_options_from_mapping({"max_session_memory": text})
    assert spec.limits.max_session_memory == n


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("12X", "expected a number of bytes with an optional K, M, G or T suffix"),
        ("", "expected a number of bytes"),
        ("-1G", "expected a number of bytes"),
        ("1.5", "expected a number of bytes"),
        ("G", "expected a number of bytes"),
        ("1e9", "expected a number of bytes"),
        ("0", "expected a size of at least one byte"),
        ("0.0001K", "expected a size of at least one byte"),
    ],
)
def test_bad_sizes_are_refused_with_what_a_size_is(
    text: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ParameterError, match=words) as e:
        parse_size(text, "--max-session-memory")
    assert str(e.value).startswith("--max-session-memory: ")
    assert isinstance(e.value, OxiLlamaError)
    # The command refuses it by the flag's name before anything starts.
    with pytest.raises(SystemExit) as exit_:
        main(["serve", f"--max-session-memory={text}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --max-session-memory: {words}" in err and repr(text) in err


def test_serve_run_refuses_a_bad_size_by_name() -> None:
    with pytest.raises(ParameterError, match="--max-session-memory: expected a number of bytes"):
        serve_options_from_mapping({"max_session_memory": "lots"})


@pytest.mark.parametrize("bad", [0, -5, True, 1.5])
def test_limits_refuse_a_budget_that_is_not_a_positive_integer(bad: object) -> None:
    with pytest.raises(ParameterError, match="max_session_memory must be a positive integer"):
        Limits(max_session_memory=bad)  # type: ignore[arg-type]
