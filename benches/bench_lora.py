"""LoRA adapter cost on SmolLM2 at 2 threads.

    python benches/bench_lora.py [--tokens 128] [--reps 5] [--block 8] [--blocks 200]

1. Decode tok/s of one Engine, base vs a rank-16 F16 adapter on all seven
   projections (q, k, v, o, gate, up, down) of every layer: two engines on
   the same mapped model (one with the adapter) decode the same prompt
   greedily, alternating in blocks of --block tokens (this VM is shared, so
   fine alternation keeps both sides under the same load); medians of the
   blocks' tok/s. Bar: the adapter costs at most 15% of decode tok/s.
2. AsyncEngine aggregate decode tok/s: 8 concurrent streams, each with a
   different rank-16 adapter, vs one stream with an adapter; alternated,
   medians. Bar: 8 streams >= 2.5x one stream.
3. Where the batched cost goes: one native `eval_batch` step of 8 rows with
   no adapter, one adapter shared by the 8 rows, 8 different adapters; one
   row alone with and without an adapter; --steps alternated, fastest and
   median of each.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from oxillama import AsyncEngine, Engine, SamplerConfig, _native
from oxillama.model.paths import default_model_path

# The test adapters' writer (tests/lora/adapters.py), from the repository.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _cpu import describe as describe_cpu

from tests.lora import adapters

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at",
    "My favourite fruit is",
    "In 1969, astronauts",
    "The quick brown fox",
]


def make(base: Path, folder: Path, n: int) -> list[Path]:
    arch, shapes = adapters.base_shapes(base)
    out = []
    for i in range(n):
        p = folder / f"r16_{i}.gguf"
        ab = adapters.pairs(shapes, adapters.smollm2_layers(), rank=16, seed=100 + i, b_std=0.02)
        adapters.write(p, arch, ab, alpha=32.0, dtype="f16")
        out.append(p)
    return out


def block_rate(e: Engine, tokens: int) -> float:
    """Tok/s of the next ``tokens`` greedy tokens (the session continues)."""
    out = e.generate("", tokens, ignore_eos=True)
    return len(out.tokens) / out.timings.decode_seconds


async def streams(ai: AsyncEngine, names: list[str], tokens: int) -> float:
    g = SamplerConfig.greedy()
    t0 = time.perf_counter()
    outs = await asyncio.gather(
        *(
            ai.generate(PROMPTS[i % 8], tokens, sampler=g, ignore_eos=True, lora=name)
            for i, name in enumerate(names)
        )
    )
    total = time.perf_counter() - t0
    prefill = max(o.timings.prompt_seconds for o in outs)
    return sum(len(o.tokens) for o in outs) / (total - prefill)


def step_costs(base: Path, paths: list[Path], steps: int) -> None:
    m = _native.Model(_native.GgufFile.open(str(base)))
    ads = [_native.LoraAdapter(m, _native.GgufFile.open(str(p))) for p in paths]
    pool = _native.KvPool(m, 1024)
    prompt = np.array([1, 504, 3458], dtype=np.uint32)
    batch = [_native.Session(m, 2048, 2, pool=pool) for _ in range(8)]
    for s in batch:
        s.eval(prompt)
    one = _native.Session(m, 2048, 2)
    one.eval(prompt)
    cases = {
        "8 rows, no adapter": [[] for _ in ads],
        "8 rows, one shared adapter": [[(ads[0], 1.0)] for _ in ads],
        "8 rows, 8 adapters": [[(a, 1.0)] for a in ads],
    }
    times: dict[str, list[float]] = {k: [] for k in [*cases, "1 row", "1 row, adapter"]}
    tok = np.array([282], dtype=np.uint32)
    for _ in range(steps):
        for name, loras in cases.items():
            for s, lo in zip(batch, loras, strict=True):
                s.set_loras(lo)
            t = time.perf_counter()
            _native.eval_batch(batch, [[282]] * 8)
            times[name].append(time.perf_counter() - t)
        for name, lo in (("1 row", []), ("1 row, adapter", [(ads[0], 1.0)])):
            one.set_loras(lo)
            t = time.perf_counter()
            one.eval(tok)
            times[name].append(time.perf_counter() - t)
    print(f"one forward step, ms (fastest / median of {steps}, alternated):")
    for name, v in times.items():
        print(f"  {name}: {1e3 * min(v):.2f} / {1e3 * statistics.median(v):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=200)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    base = default_model_path()
    print(f"CPU: {describe_cpu()}; SmolLM2-135M-Instruct Q4_1, 2 threads")
    with tempfile.TemporaryDirectory() as tmp:
        paths = make(base, Path(tmp), 8)
        g = SamplerConfig.greedy()
        plain = Engine(base, context_size=4096, threads=2, sampler=g)
        tuned = Engine(base, context_size=4096, threads=2, sampler=g)
        adapter = tuned.load_lora(paths[0])
        print(
            f"adapter: rank 16 on {len(adapter.targets)} matrices, "
            f"{adapter.nbytes / 2**20:.1f} MiB F16"
        )
        base_r, lora_r = [], []
        for e in (plain, tuned):
            e.generate(PROMPTS[1], args.block, ignore_eos=True)  # warm both the same way
        while plain.n_past + 2 * args.block < plain.n_ctx and len(base_r) < args.blocks:
            base_r.append(block_rate(plain, args.block))
            lora_r.append(block_rate(tuned, args.block))
        b, lo = statistics.median(base_r), statistics.median(lora_r)
        cost = 1 - lo / b
        print(f"decode tok/s over {len(base_r)} alternated blocks of {args.block} tokens:")
        print(f"  base {b:.1f}, rank-16 adapter {lo:.1f}")
        print(
            f"  adapter cost {100 * cost:.1f}% (bar <= 15%): {'PASS' if cost <= 0.15 else 'FAIL'}"
        )

        async def batched() -> tuple[list[float], list[float]]:
            loras = {f"a{i}": p for i, p in enumerate(paths)}
            async with AsyncEngine(
                base, context_size=512, threads=2, max_batch=8, loras=loras
            ) as ai:
                await streams(ai, ["a0"], 8)
                await streams(ai, list(loras), 8)
                one, eight = [], []
                for _ in range(args.reps):
                    one.append(await streams(ai, ["a0"], args.tokens))
                    eight.append(await streams(ai, list(loras), args.tokens))
                return one, eight

        one, eight = asyncio.run(batched())
        step_costs(base, paths, args.steps)
        o, g = statistics.median(one), statistics.median(eight)
        print(f"AsyncEngine decode tok/s: 1 stream {o:.1f}, 8 streams with 8 adapters {g:.1f}")
        print(f"  runs 1 {[round(x, 1) for x in one]}, 8 {[round(x, 1) for x in eight]}")
        print(f"  ratio {g / o:.2f}x (bar >= 2.5x): {'PASS' if g / o >= 2.5 else 'FAIL'}")


if __name__ == "__main__":
    main()
