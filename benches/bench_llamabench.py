"""``oxillama bench`` next to llama.cpp's ``llama-bench``: the same model(s),
tests and thread counts, the two tools alternating, then both markdown
tables and a ratio table.

  python benches/bench_llamabench.py --llama-bench ~/llama.cpp/build/bin/llama-bench
  python benches/bench_llamabench.py --llama-bench PATH -m model.gguf -p 512 -n 128 -t 1,2,4
  python benches/bench_llamabench.py --llama-bench PATH -d 0,4096 --rounds 3
  python benches/bench_llamabench.py --llama-bench PATH -m gemma.gguf -p 4096 -n 32 \
      -d 0,4096 -ctk q8_0 -ctv q8_0 --fa 0,1

``--fa 0,1`` runs llama-bench once per flash-attention setting and sets
oxillama against the better of the two, test by test (llama.cpp's best).
``-ctk``/``-ctv`` give both tools the same KV cache types.

Each round runs, per model and thread count, one tool then the other (the
order flips every round, so neither always runs on a warmer or cooler
machine); each run is the tool's own warm-up and ``-r`` repetitions. The
tables pool the repetitions of every round: mean ± standard deviation of
tokens/s, as llama-bench reports them. Both tools get the same -p/-n/-d/-t/
-r text, so ranges (``1-8*2``) mean the same to both. Run it on a quiet
machine: the figures are only comparable within one run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cpu import describe as describe_cpu

from oxillama._native import __version__, physical_core_count
from oxillama.cli.bench import MD_COLUMNS, md_line
from oxillama.model.paths import default_model_path
from oxillama.model.summary import format_params, format_size

Key = tuple[str, int, str]  # model file, threads, test name


def test_name(r: dict[str, Any]) -> str:
    pp, tg, depth = r["n_prompt"], r["n_gen"], r["n_depth"]
    name = f"pp{pp}" if tg == 0 else f"tg{tg}" if pp == 0 else f"pp{pp}+tg{tg}"
    return name + (f" @ d{depth}" if depth else "")


def run_tool(cmd: list[str]) -> list[dict[str, Any]]:
    """Runs one tool with ``-o jsonl`` and returns its records."""
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
    records = [json.loads(line) for line in out.splitlines() if line.strip()]
    # As it goes, so a run cut short still leaves every figure measured.
    for r in records:
        reps = " ".join(f"{float(x):.1f}" for x in r["samples_ts"])
        print(f"  t={r['n_threads']} {test_name(r)}: {reps} tokens/s", file=sys.stderr, flush=True)
    return records


class Pool:
    """Every repetition of every round, per model, threads and test."""

    def __init__(self) -> None:
        self.samples: dict[Key, list[float]] = defaultdict(list)
        self.first: dict[Key, dict[str, Any]] = {}

    def add(self, records: Iterable[dict[str, Any]]) -> None:
        for r in records:
            key = (r["model_filename"], int(r["n_threads"]), test_name(r))
            self.samples[key] += [float(x) for x in r["samples_ts"]]
            self.first.setdefault(key, r)

    def mean_sd(self, key: Key) -> tuple[float, float]:
        ts = self.samples[key]
        return statistics.fmean(ts), statistics.stdev(ts) if len(ts) > 1 else 0.0

    def table(self) -> str:
        lines = [md_line(n for n, _ in MD_COLUMNS)]
        lines.append(md_line("-" * (abs(w) - 1) + (":" if w > 0 else "-") for _, w in MD_COLUMNS))
        for key, r in self.first.items():
            mean, sd = self.mean_sd(key)
            cells = (
                r["model_type"],
                format_size(int(r["model_size"])),
                format_params(int(r["model_n_params"])),
                r.get("backends") or "CPU",
                str(key[1]),
                key[2],
                f"{mean:.2f} ± {sd:.2f}",
            )
            lines.append(md_line(cells))
        return "".join(lines)


def best_of(pools: list[Pool]) -> Pool:
    """Per test, the pool (flash attention setting) with the higher mean."""
    best = Pool()
    for p in pools:
        for key, r in p.first.items():
            if key not in best.first or p.mean_sd(key)[0] > best.mean_sd(key)[0]:
                best.first[key] = r
                best.samples[key] = list(p.samples[key])
    return best


def ratio_table(ox: Pool, cpp: Pool) -> str:
    rows = ["| model | threads | test | oxillama t/s | llama.cpp t/s | oxillama / llama.cpp |\n"]
    rows.append("| --- | ---: | --- | ---: | ---: | ---: |\n")
    ratios: dict[str, list[float]] = defaultdict(list)
    for key, r in ox.first.items():
        if key not in cpp.first:
            continue
        a, b = ox.mean_sd(key)[0], cpp.mean_sd(key)[0]
        ratio = a / b if b > 0 else math.nan
        ratios[key[2][:2]].append(ratio)
        rows.append(
            f"| {r['model_type']} | {key[1]} | {key[2]} | {a:.2f} | {b:.2f} | {ratio:.2f} |\n"
        )
    rows.append("\n")
    for kind, rs in sorted(ratios.items()):
        ok = [x for x in rs if x > 0 and math.isfinite(x)]
        if ok:
            gm = math.exp(statistics.fmean(math.log(x) for x in ok))
            rows.append(f"geometric mean of the {kind} ratios: {gm:.2f} ({len(ok)} tests)\n")
    return "".join(rows)


def repetitions(name: str, pool: Pool) -> str:
    """Every repetition in the order it ran, and the farthest one from the
    median: a steady engine keeps each within a few percent."""
    rows = [f"{name}: each repetition, tokens/s, in the order they ran\n"]
    for key, ts in pool.samples.items():
        med = statistics.median(ts)
        worst = max(abs(t / med - 1) for t in ts) if med > 0 else math.nan
        reps = " ".join(f"{t:.1f}" for t in ts)
        spread = f"(median {med:.1f}, farthest {worst:.0%})"
        model = Path(key[0]).name
        rows.append(f"  {model} t={key[1]:<3} {key[2]:<10} {reps}  {spread}\n")
    return "".join(rows) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--llama-bench", required=True, metavar="PATH", help="llama-bench binary")
    ap.add_argument("-m", "--model", action="append", help="GGUF (repeatable or comma list)")
    ap.add_argument("-p", "--n-prompt", default="512")
    ap.add_argument("-n", "--n-gen", default="128")
    ap.add_argument("-d", "--n-depth", default="0")
    ap.add_argument("-t", "--threads", default=str(physical_core_count()))
    ap.add_argument("-r", "--repetitions", default="5")
    ap.add_argument("--rounds", type=int, default=1, help="alternations of the two (default 1)")
    ap.add_argument("-ctk", "--cache-type-k", default="f16", help="KV type of the keys (both)")
    ap.add_argument("-ctv", "--cache-type-v", default="f16", help="KV type of the values (both)")
    ap.add_argument(
        "--fa",
        default="",
        help="llama-bench's flash-attention settings, comma list (default: its own); with "
        "several, oxillama is set against the best of them per test",
    )
    args = ap.parse_args()

    models = [os.path.expanduser(m) for a in args.model or [] for m in a.split(",") if m] or [
        str(default_model_path())
    ]
    threads = [t for t in args.threads.split(",") if t]
    common = ["-p", args.n_prompt, "-n", args.n_gen, "-d", args.n_depth, "-r", args.repetitions]
    common += ["-ctk", args.cache_type_k, "-ctv", args.cache_type_v]
    fas = [f for f in args.fa.split(",") if f]
    ox = Pool()
    cpps = {fa: Pool() for fa in fas or [""]}
    refused: dict[str, str] = {}
    for rnd in range(args.rounds):
        for model in models:
            for t in threads:
                runs = [(ox, [sys.executable, "-m", "oxillama", "bench"])]
                runs += [
                    (pool, [args.llama_bench, *(["-fa", fa] if fa else [])])
                    for fa, pool in cpps.items()
                ]
                if rnd % 2:
                    runs.reverse()
                for pool, tool in runs:
                    cmd = [*tool, "-m", model, "-t", t, *common, "-o", "jsonl"]
                    if pool is ox or len(cpps) == 1:
                        pool.add(run_tool(cmd))
                        continue
                    # One setting llama.cpp refuses (a quantized V cache
                    # needs flash attention) leaves the best of the others.
                    fa = tool[2]
                    if fa in refused:
                        continue
                    try:
                        pool.add(run_tool(cmd))
                    except subprocess.CalledProcessError as e:
                        refused[fa] = f"exit status {e.returncode}"

    cpp = best_of(list(cpps.values()))
    first = next(iter(cpp.first.values()), {})
    print(f"CPU: {describe_cpu()}, {physical_core_count()} physical cores")
    print(f"llama-bench cpu_info: {first.get('cpu_info', '?')}")
    print(f"oxillama {__version__}; llama.cpp build {first.get('build_commit', '?')}")
    print(f"settings: {' '.join(common)} -t {args.threads}; {args.rounds} round(s)\n")
    print("oxillama bench\n")
    print(ox.table())
    for fa, pool in cpps.items():
        print(f"llama-bench{f' -fa {fa}' if fa else ''}\n")
        if fa in refused:
            print(f"llama-bench refused these settings ({refused[fa]})\n")
            continue
        print(pool.table())
    if len(cpps) > 1:
        print("ratios against the better llama-bench setting per test\n")
    print(ratio_table(ox, cpp))
    print(repetitions("oxillama", ox), end="")
    for fa, pool in cpps.items():
        if fa not in refused:
            print(repetitions(f"llama.cpp{f' -fa {fa}' if fa else ''}", pool), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
