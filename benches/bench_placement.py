"""Where a busy neighbour sits decides a 2-thread decode step (issue 35).

Two of our threads and one busy process (``yes > /dev/null``) on two cores:
the scheduler puts two of the three on one core. Which two matters, and
this bench pins each case to show by how much:

  quiet      no neighbour (the two threads on a core each)
  beside W   the caller (the thread that runs the serial parts of a step)
             has a core of its own; the neighbour shares the worker's
  beside M   the neighbour shares the caller's core; the worker has its own

The caller is the Python thread; the worker inherits the affinity the
caller had when the engine started its pool. SmolLM2, decode steps over
depths 16-448 as in bench_contention.py, the cases alternating, medians
of each run's median step (ms).

  python benches/bench_placement.py --reps 3
  python benches/bench_placement.py --reps 3 --loop session

``--loop session`` times the engine's native session called in a tight
loop (a prebuilt token array, no Python between steps beyond the call), as
a server's batch loop or another native caller drives it: between two
steps the pool's worker then never waits long enough to yield its core.

Linux only (per-thread affinity through os.sched_setaffinity). Measure on
an otherwise quiet machine with two logical CPUs, 0 and 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from _cpu import describe as describe_cpu

PROMPT = "The history of computing is a story of abstraction layered upon abstraction."
MAX_POS = 448
CASES = {"quiet": None, "beside W": 1, "beside M": 0}


def worker(case: str, model: str, window: float, loop: str) -> None:
    """Decodes for `window` seconds with the caller on CPU 0, the worker on
    CPU 1 and the neighbour where `case` puts it; prints the step times."""
    from oxillama import Engine

    os.sched_setaffinity(0, {1})  # the pool's worker starts with this
    e = Engine(model, threads=2, context_size=512)
    os.sched_setaffinity(0, {0})
    prompt = e.tokenize(PROMPT)
    tok = prompt[-1]
    e.eval(prompt)
    for _ in range(16):
        e.eval([tok])
    hog = None
    cpu = CASES[case]
    if cpu is not None:
        hog = subprocess.Popen(["taskset", "-c", str(cpu), "yes"], stdout=subprocess.DEVNULL)
        time.sleep(0.2)
    times: list[float] = []
    session = e._session  # the native session under the engine
    one = np.array([tok], dtype=np.uint32)
    try:
        end = time.perf_counter() + window
        while time.perf_counter() < end:
            e.reset()
            e.eval(prompt)
            if loop == "session":
                for _ in range(MAX_POS - len(prompt)):
                    t0 = time.perf_counter()
                    session.eval(one, False)
                    times.append((time.perf_counter() - t0) * 1e3)
                continue
            while e.n_past < MAX_POS:
                t0 = time.perf_counter()
                e.eval([tok])
                times.append((time.perf_counter() - t0) * 1e3)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    print(json.dumps(times), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--window", type=float, default=3.0, help="seconds of decoding per run")
    ap.add_argument(
        "--loop",
        choices=("engine", "session"),
        default="engine",
        help="time Engine.eval (default) or the native session in a tight loop",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.model is None:
        from oxillama import default_model_path

        args.model = str(default_model_path())
    if args.worker:
        worker(args.worker, args.model, args.window, args.loop)
        return
    if not hasattr(os, "sched_setaffinity") or not {0, 1} <= os.sched_getaffinity(0):
        sys.exit("bench_placement: needs Linux and CPUs 0 and 1")

    runs: dict[str, list[float]] = {c: [] for c in CASES}
    for rep in range(args.reps):
        order = list(CASES) if rep % 2 == 0 else list(CASES)[::-1]
        for case in order:
            cmd = [sys.executable, __file__, "--worker", case, "--model", args.model]
            cmd += ["--window", str(args.window), "--loop", args.loop]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            runs[case].append(statistics.median(json.loads(out)))
    print(f"CPU: {describe_cpu()}")
    print(f"model: {args.model}")
    import oxillama

    print(f"oxillama: {oxillama.__file__}")
    print(
        f"{args.reps} repetitions, {args.window:g} s windows; 2 threads; "
        f"{args.loop} loop; median decode step, ms"
    )
    print()
    for case, got in runs.items():
        each = " ".join(f"{x:.2f}" for x in got)
        print(f"{case:<10} {statistics.median(got):>7.2f}   ({each})")


if __name__ == "__main__":
    main()
