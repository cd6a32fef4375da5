"""AsyncEngine on the real SmolLM2: concurrent calls share batched decode
steps and give exactly the tokens a lone Engine gives, cancellation frees
the request at once, errors are typed, and the event loop keeps running."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from oxillama import AsyncEngine, Engine, SamplerConfig
from oxillama.errors import GenerateError, ParameterError

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


@pytest.fixture(scope="module")
def aengine(model_path: Path) -> Iterator[AsyncEngine]:
    e = AsyncEngine(model_path, context_size=512, threads=2, max_batch=16, prefill_chunk=32)
    yield e
    asyncio.run(e.close())


def test_concurrent_streams_match_a_lone_engine(aengine: AsyncEngine, model_path: Path) -> None:
    greedy = SamplerConfig.greedy()
    lone = Engine(model_path, context_size=512, threads=2)
    want = []
    for p in PROMPTS * 2:
        lone.reset()
        want.append(lone.generate(p, 12, sampler=greedy, ignore_eos=True).tokens)

    async def one(p: str) -> tuple[str, list[int]]:
        pieces = []
        result: list = []
        async for piece in aengine.stream(p, 12, sampler=greedy, ignore_eos=True, result=result):
            pieces.append(piece)
        return "".join(pieces), result[0].tokens

    async def main() -> list[tuple[str, list[int]]]:
        return await asyncio.gather(*(one(p) for p in PROMPTS * 2))

    before = aengine.metrics()
    got = asyncio.run(main())
    after = aengine.metrics()
    assert [toks for _, toks in got] == want  # 16 concurrent streams
    assert all(text for text, _ in got)
    steps = after["decode_steps"] - before["decode_steps"]
    generated = after["generated_tokens"] - before["generated_tokens"]
    assert generated == 16 * 12
    # Shared steps: far fewer forward passes than tokens.
    assert steps < generated / 4, (steps, generated)
    assert after["running"] == 0 and after["sequences_with_kv"] == 0
    # The host-side work of those steps was counted, apart from the passes.
    host = after["host_seconds"] - before["host_seconds"]
    passes = sum(after[k] - before[k] for k in ("decode_seconds", "prefill_seconds"))
    assert 0 < host and 0 < passes, (host, passes)


async def until_metrics(
    engine: AsyncEngine, cond: Callable[[dict[str, float | int]], bool], timeout: float = 30.0
) -> None:
    """Polls the engine's metrics until ``cond`` holds: a fixed sleep before
    cancelling raced the requests, which a fast enough machine finished
    first (four 150-token requests took 0.66 s against a 0.8 s sleep)."""
    deadline = time.monotonic() + timeout
    while not cond(m := engine.metrics()):
        assert time.monotonic() < deadline, m
        await asyncio.sleep(0.005)


def test_leaving_a_stream_early_cancels_it(aengine: AsyncEngine) -> None:
    async def main() -> None:
        n = 0
        async for _ in aengine.stream("Count to one hundred:", 200, ignore_eos=True):
            n += 1
            if n == 3:
                break
        before = aengine.metrics()["generated_tokens"]
        task = asyncio.create_task(aengine.generate("Tell me a story.", 300, ignore_eos=True))
        await until_metrics(aengine, lambda m: m["generated_tokens"] > before)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            m = aengine.metrics()
            if m["running"] == 0 and m["sequences_with_kv"] == 0:
                break
            await asyncio.sleep(0.05)
        assert m["running"] == 0 and m["sequences_with_kv"] == 0, m

    asyncio.run(main())


def test_cancellation_returns_every_kv_page(model_path: Path) -> None:
    """With the prefix cache off, cancelled and finished requests leave the
    shared pool exactly as full as it started (empty)."""

    async def main() -> None:
        async with AsyncEngine(
            model_path, context_size=256, threads=2, max_batch=4, prefix_cache_bytes=0
        ) as e:
            total = e.metrics()["kv_pages_total"]
            tasks = [asyncio.create_task(e.generate(p, 150, ignore_eos=True)) for p in PROMPTS[:4]]
            # Cancelled while all four decode, whatever the machine's speed.
            await until_metrics(e, lambda m: m["running"] == 4 and m["generated_tokens"] >= 8)
            assert e.metrics()["kv_pages_used"] > 0
            for t in tasks[:3]:
                t.cancel()
            for t in tasks[:3]:
                with pytest.raises(asyncio.CancelledError):
                    await t
            tasks[3].cancel()
            with pytest.raises(asyncio.CancelledError):
                await tasks[3]
            for _ in range(100):
                m = e.metrics()
                if m["kv_pages_free"] == total:
                    break
                await asyncio.sleep(0.05)
            assert m["kv_pages_used"] == 0 and m["kv_pages_free"] == total, m

    asyncio.run(main())


def _preempted_runs_match_a_lone_engine(
    model_path: Path, prompts: list[str], cfg: SamplerConfig, n: int, **engine_kw: int
) -> None:
    """Runs ``prompts`` together in a small shared KV pool (the caller's
    ``engine_kw``) and checks every output against a lone Engine, that
    preemption happened, and that every page came back.

    The lone Engine prefills in the scheduler's chunks. A chunk of one token
    goes through the one-token kernel, whose attention splits long key
    ranges and so rounds differently from a prefill; the same chunks make the
    comparison exact by construction rather than by luck."""
    n_ctx = engine_kw["context_size"]
    lone = Engine(
        model_path,
        context_size=n_ctx,
        threads=2,
        prefill_chunk=engine_kw.get("prefill_chunk", 64),
    )
    want = []
    for p in prompts:
        lone.reset()
        want.append(lone.generate(p, n, sampler=cfg, ignore_eos=True).tokens)

    async def main() -> tuple[list[list[int]], dict[str, float | int]]:
        async with AsyncEngine(model_path, threads=2, prefix_cache_bytes=0, **engine_kw) as e:
            outs = await asyncio.gather(
                *(e.generate(p, n, sampler=cfg, ignore_eos=True) for p in prompts)
            )
            return [o.tokens for o in outs], e.metrics()

    got, m = asyncio.run(main())
    assert got == want
    assert m["preempted"] > 0, m
    assert m["kv_pages_used"] == 0, m


def test_a_full_kv_pool_preempts_and_recomputes_exactly(model_path: Path) -> None:
    """Four requests in a pool that holds one context (8 pages of 16): the
    newest are preempted when it runs out, recomputed later, and every
    request still gets exactly the tokens a lone Engine gives."""
    _preempted_runs_match_a_lone_engine(
        model_path,
        PROMPTS[:4],
        SamplerConfig.greedy(),
        60,
        context_size=128,
        max_batch=4,
        kv_pages=8,
    )


def test_the_event_loop_is_never_blocked(aengine: AsyncEngine) -> None:
    async def main() -> float:
        worst = 0.0
        done = False

        async def ticker() -> None:
            nonlocal worst
            while not done:
                t = time.perf_counter()
                await asyncio.sleep(0.01)
                worst = max(worst, time.perf_counter() - t)

        tick = asyncio.create_task(ticker())
        await aengine.generate("A long prompt. " * 40, 20, ignore_eos=True)
        done = True
        await tick
        return worst

    assert asyncio.run(main()) < 0.25


def test_errors_are_typed(aengine: AsyncEngine) -> None:
    async def main() -> None:
        with pytest.raises(GenerateError, match="does not fit"):
            await aengine.generate([1] * 600, 4)
        with pytest.raises(ParameterError, match="max_tokens"):
            await aengine.generate("hi", -1)
        out = await aengine.generate("Answer yes or no:", 4, grammar='root ::= "yes" | "no"')
        assert out.text in ("yes", "no")
        chat = await aengine.chat([{"role": "user", "content": "Hi!"}], 8)
        assert chat.finish_reason in ("eos", "length", "stop")

    asyncio.run(main())


def test_async_snapshot_and_restore(model_path: Path, tmp_path: Path) -> None:
    cfg = SamplerConfig(temperature=0.9, seed=7)
    e = Engine(model_path, context_size=256, threads=2, sampler=cfg)
    whole = e.generate("The sea", 30, ignore_eos=True).tokens
    e.reset()
    first = e.generate("The sea", 10, ignore_eos=True).tokens

    async def main() -> list[int]:
        await AsyncEngine.snapshot(e, tmp_path / "s.oxisnap")
        restored = await AsyncEngine.restore(tmp_path / "s.oxisnap", threads=1)
        return restored.generate("", 20, ignore_eos=True).tokens

    assert first + asyncio.run(main()) == whole


def test_preemption_during_chunked_prefill_is_exact_too(model_path: Path) -> None:
    """Long prompts prefilled in small chunks while others decode, in a pool
    of one context: sequences are preempted half-prefilled as well, and the
    sampler (with a repetition penalty, which sees every prompt token) still
    gives the tokens of a lone Engine with the same seed."""
    _preempted_runs_match_a_lone_engine(
        model_path,
        [f"{p} " + " ".join(["and then"] * 30) for p in PROMPTS[:3]],
        SamplerConfig(temperature=0.7, seed=5, repetition_penalty=1.3),
        40,
        context_size=160,
        max_batch=3,
        prefill_chunk=16,
        kv_pages=10,
    )


def test_prefills_that_fill_the_pool_never_jam(model_path: Path) -> None:
    """Eight requests prefilled in small chunks into a pool of one context:
    every page ends up held by half-prefilled sequences that each wait for
    more. The newest gives its pages up so the oldest goes on; before that
    rule the scheduler spun forever here. Results stay exact."""
    prompts = [f"{p} " + " ".join(["and so on"] * 4) for p in PROMPTS]
    greedy = SamplerConfig.greedy()
    lone = Engine(model_path, context_size=64, threads=2, prefill_chunk=8)
    want = []
    for p in prompts:
        lone.reset()
        want.append(lone.generate(p, 8, sampler=greedy, ignore_eos=True).tokens)

    async def main() -> tuple[list[list[int]], dict[str, float | int]]:
        async with AsyncEngine(
            model_path,
            context_size=64,
            threads=2,
            max_batch=8,
            prefill_chunk=8,
            prefix_cache_bytes=0,
            kv_pages=4,
        ) as e:
            outs = await asyncio.wait_for(
                asyncio.gather(
                    *(e.generate(p, 8, sampler=greedy, ignore_eos=True) for p in prompts)
                ),
                timeout=120,
            )
            return [o.tokens for o in outs], e.metrics()

    got, m = asyncio.run(main())
    assert got == want
    assert m["preempted"] > 0 and m["kv_pages_used"] == 0, m
