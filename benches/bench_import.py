"""Import time of oxillama against llama-cpp-python, in fresh processes.

Each sample is one new interpreter that times its own import statement
(perf_counter around it, so interpreter start-up is left out), the three
statements alternating, medians over ``--reps`` (default 9):

    python benches/bench_import.py [--reps 9]

``import oxillama`` loads the errors and the native extension only;
``from oxillama import Engine`` is what a program that runs a model pays
before its first call."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

from _cpu import describe

STATEMENTS = {
    "import oxillama": "import oxillama",
    "from oxillama import Engine": "from oxillama import Engine",
    "import llama_cpp": "import llama_cpp",
}

PROBE = (
    "import time; t = time.perf_counter(); exec({stmt!r}); print((time.perf_counter() - t) * 1e3)"
)


def sample(stmt: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(stmt=stmt)],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    print(describe())
    times: dict[str, list[float]] = {k: [] for k in STATEMENTS}
    for name in STATEMENTS:  # one warm-up each: the page cache, not the import
        sample(STATEMENTS[name])
    for _ in range(args.reps):
        for name, stmt in STATEMENTS.items():
            times[name].append(sample(stmt))
    base = statistics.median(times["import llama_cpp"])
    print(f"| statement | median ms (of {args.reps}) | min | max | vs import llama_cpp |")
    print("|---|---|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| `{name}` | {med:.1f} | {min(ts):.1f} | {max(ts):.1f} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()
