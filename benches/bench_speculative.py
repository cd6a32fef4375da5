"""Speculative decoding against the target alone, on the pair made by
scripts/make_spec_pair.py (SmolLM2 F16 target, Q4_0 draft), 2 threads.

    python benches/bench_speculative.py [--tokens 128] [--k 4] [--reps 3]

Greedy decode tokens/s of both (medians), the ratio (bar 1.5x) and the
acceptance rate.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

from oxillama import Engine, SamplerConfig
from oxillama.speculative import SpeculativeEngine

PROMPTS = ["Once upon a time", "The history of science", "def quicksort(xs):"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("pair", root / "scripts/make_spec_pair.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tpath, dpath = mod.make_pair(Path.home() / ".cache/oxillama/spec")
    target = Engine(tpath, context_size=1024, threads=2)
    draft = Engine(dpath, context_size=1024, threads=2)
    se = SpeculativeEngine(target, draft, num_speculative=args.k)
    g = SamplerConfig.greedy()
    alone, spec_rates, acc = [], [], []
    for _ in range(args.reps):
        for p in PROMPTS:
            target.reset()
            t = time.perf_counter()
            a = target.generate(p, args.tokens, sampler=g, ignore_eos=True)
            alone.append(args.tokens / (time.perf_counter() - t - a.timings.prompt_seconds))
            se.reset()
            t = time.perf_counter()
            b = se.generate(p, args.tokens, sampler=g, ignore_eos=True)
            spec_rates.append(args.tokens / (time.perf_counter() - t - b.timings.prompt_seconds))
            acc.append(se.stats.acceptance_rate)
            assert a.tokens == b.tokens
    ma, ms = statistics.median(alone), statistics.median(spec_rates)
    print(f"target alone {ma:.1f} tok/s, speculative (k={args.k}) {ms:.1f} tok/s")
    print(f"ratio {ms / ma:.2f}x (bar 1.5x), acceptance {statistics.median(acc):.2f}")


if __name__ == "__main__":
    main()
