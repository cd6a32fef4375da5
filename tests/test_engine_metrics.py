"""``Engine.metrics()``: the synchronous engine's running totals under the
names ``AsyncEngine.metrics()`` uses."""

from __future__ import annotations

import asyncio
from pathlib import Path

from oxillama import AsyncEngine, Engine, SamplerConfig


def test_engine_metrics_count_calls_tokens_and_time(model_path: Path) -> None:
    eng = Engine(model_path, context_size=256, threads=2, sampler=SamplerConfig.greedy())
    m0 = eng.metrics()
    assert m0["calls"] == 0 and m0["generated_tokens"] == 0
    a = eng.generate("The capital of France is", 6, ignore_eos=True)
    b = eng.generate(" and of Spain", 4, ignore_eos=True)
    m = eng.metrics()
    assert m["calls"] == 2
    assert m["generated_tokens"] == len(a.tokens) + len(b.tokens) == 10
    assert m["prompt_tokens"] == a.timings.prompt_tokens + b.timings.prompt_tokens
    assert m["prefill_seconds"] > 0 and m["decode_seconds"] > 0
    assert m["decode_tokens_per_second"] == m["generated_tokens"] / m["decode_seconds"]
    assert m["prefix_cache_enabled"] == 0


def test_chat_reports_the_prompt_it_kept(model_path: Path) -> None:
    eng = Engine(model_path, context_size=512, threads=2, sampler=SamplerConfig.greedy())
    msgs = [{"role": "user", "content": "Name a colour."}]
    reply = eng.chat(msgs, 4)
    eng.chat(
        [
            *msgs,
            {"role": "assistant", "content": reply.text},
            {"role": "user", "content": "Another."},
        ],
        4,
    )
    assert eng.metrics()["reused_prompt_tokens"] > 10


def test_the_names_are_async_engines(model_path: Path) -> None:
    async def names() -> set[str]:
        ae = AsyncEngine(model_path, context_size=128, threads=2)
        try:
            return set(ae.metrics())
        finally:
            await ae.close()

    sync = Engine(model_path, context_size=128, threads=2).metrics()
    shared = {
        "prompt_tokens",
        "generated_tokens",
        "prefill_seconds",
        "decode_seconds",
        "prompt_tokens_per_second",
        "decode_tokens_per_second",
        "prefix_cache_enabled",
    }
    assert shared <= set(sync)
    assert shared <= asyncio.run(names())
