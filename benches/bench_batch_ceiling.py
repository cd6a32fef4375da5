"""The most ``bench_serve_scaling.py`` can show: the engine alone, one-row
against eight-row decode steps, with no server, client or sampling.

    python benches/bench_batch_ceiling.py [--blocks 10] [--rows 8] [--model GGUF]

Blocks of 128 steps at the serving bench's depths (a 6-token prompt, then
128 tokens) alternate between one sequence and ``--rows`` sequences in one
process (the order flips every block). Prints each block's mean step, the
medians, and ``rows * t1 / t_rows``: the ratio of decode throughputs the
serving bench's "8 streams against 1" cannot exceed, since everything the
server adds costs the eight-stream step more than the one-stream step.
Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from _cpu import describe as describe_cpu

from oxillama import _native
from oxillama.model.paths import default_model_path

STEPS = 128
PROMPT = np.arange(1, 7, dtype=np.uint32)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--blocks", type=int, default=10, help="blocks of 128 steps per side")
    ap.add_argument("--rows", type=int, default=8, help="sequences in the batched step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", help="GGUF (default: SmolLM2)")
    a = ap.parse_args()
    path = a.model or str(default_model_path())
    model = _native.Model(_native.GgufFile.open(path))
    pool = _native.KvPool(model, 8192)
    sessions = {
        n: [_native.Session(model, 2048, a.threads, pool=pool) for _ in range(n)]
        for n in (1, a.rows)
    }
    print(f"cpu: {describe_cpu()}")
    print(f"model: {path}; {a.threads} threads; blocks of {STEPS} greedy-shaped steps")
    means: dict[int, list[float]] = {1: [], a.rows: []}
    for b in range(2 * a.blocks):
        n = (1, a.rows)[(b + b // 2) % 2]  # 1, r, r, 1, 1, r, ...
        for s in sessions[n]:
            s.reset()
            s.eval(PROMPT)
        spent = 0.0
        for j in range(STEPS):
            t = time.perf_counter()
            _native.eval_batch(sessions[n], [[282 + j % 50]] * n)
            spent += time.perf_counter() - t
        means[n].append(spent / STEPS)
        print(f"block {b + 1}: {n} row(s) {1e3 * means[n][-1]:6.2f} ms/step", flush=True)
    t1, tn = statistics.median(means[1]), statistics.median(means[a.rows])
    print(
        f"median: 1 row {1e3 * t1:.2f} ms/step ({1 / t1:.0f} tok/s), {a.rows} rows "
        f"{1e3 * tn:.2f} ms/step ({a.rows / tn:.0f} tok/s)"
    )
    print(f"ceiling of the serving ratio: {a.rows * t1 / tn:.2f}x")


if __name__ == "__main__":
    main()
