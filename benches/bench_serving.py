"""AsyncEngine serving figures on SmolLM2 at 2 threads.

    python benches/bench_serving.py [--tokens 64] [--reps 3]

1. Aggregate decode throughput: 1 stream, then 8 concurrent streams
   (greedy, ignore_eos), alternated rep by rep; tokens per second of
   decode, medians. Bar: 8 streams >= 3x one stream.
2. Time to first token of a short request that arrives while a 2,000-token
   prompt is being prefilled. Bar: <= 1 s.
3. Time to first token of a second request sharing a 1,000-token system
   prompt with the first (prefix cache). Bar: <= 10% of the first's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from oxillama import AsyncEngine, SamplerConfig

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


async def throughput(e: AsyncEngine, n: int, tokens: int) -> float:
    greedy = SamplerConfig.greedy()
    # Wait until every prompt is prefilled, then time the decode only.
    started = time.perf_counter()
    outs = await asyncio.gather(
        *(e.generate(PROMPTS[i % 8], tokens, sampler=greedy, ignore_eos=True) for i in range(n))
    )
    total = time.perf_counter() - started
    prefill = max(o.timings.prompt_seconds for o in outs)
    return sum(len(o.tokens) for o in outs) / (total - prefill)


async def first_token_during_long_prefill(e: AsyncEngine) -> float:
    long_prompt = e.tokenize("The history of computing is long and winding. " * 200)[:2000]
    long_task = asyncio.create_task(e.generate(long_prompt, 4, ignore_eos=True))
    await asyncio.sleep(0.3)  # the long prefill is under way
    t = time.perf_counter()
    async for _ in e.stream("Hi!", 4, ignore_eos=True):
        ttft = time.perf_counter() - t
        break
    await long_task
    return ttft


async def shared_system_prompt(e: AsyncEngine, rep: int) -> tuple[float, float]:
    system = e.tokenize(f"[{rep}] You are a meticulous assistant who explains things. " * 90)
    system = system[:1000]
    times = []
    for question in ("What is a prime number?", "Why is the sky blue?"):
        t = time.perf_counter()
        async for _ in e.stream(system + e.tokenize(question, add_special=False), 2):
            times.append(time.perf_counter() - t)
            break
    return times[0], times[1]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    async with AsyncEngine(context_size=2304, threads=2, max_batch=8, prefill_chunk=64) as e:
        await e.generate("warm up", 4)
        # Alternated rep by rep: this VM's speed drifts over minutes.
        one, eight = [], []
        for _ in range(args.reps):
            one.append(await throughput(e, 1, args.tokens))
            eight.append(await throughput(e, 8, args.tokens))
        ttft = [await first_token_during_long_prefill(e) for _ in range(args.reps)]
        shared = [await shared_system_prompt(e, r) for r in range(args.reps)]
    m1, m8 = statistics.median(one), statistics.median(eight)
    print(f"decode tok/s, 1 stream: {m1:.1f}; 8 streams aggregate: {m8:.1f}")
    print(f"ratio {m8 / m1:.2f}x (bar 3x)")
    print(f"first token during a 2,000-token prefill: {statistics.median(ttft):.2f} s (bar 1 s)")
    first = statistics.median(a for a, _ in shared)
    second = statistics.median(b for _, b in shared)
    print(
        f"1,000-token system prompt: first request {first:.2f} s to first token, "
        f"second {second:.3f} s ({second / first:.1%}, bar 10%)"
    )


if __name__ == "__main__":
    asyncio.run(main())
