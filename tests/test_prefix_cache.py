"""The prompt prefix cache: a radix tree over 16-token blocks with LRU
eviction under a byte budget, and, on the real model, a shared system
prompt that is prefilled once while the answers stay exactly those of a
lone Engine."""

from __future__ import annotations

import asyncio
from pathlib import Path

from oxillama import AsyncEngine, Engine, SamplerConfig
from oxillama.serving.prefix_cache import BLOCK, PrefixCache


def test_lookup_returns_the_longest_stored_block_prefix() -> None:
    c = PrefixCache(budget_bytes=1000)
    a = list(range(100))
    assert c.lookup(a) == (0, None) and c.misses == 1
    assert c.wants(a) == 96
    c.store(a, 96, b"x" * 96)
    assert c.wants(a) == 0
    # A prompt sharing 40 tokens finds nothing (only 96 is stored)...
    b = a[:40] + [999] * 60
    assert c.lookup(b) == (0, None)
    c.store(b, 32, b"y" * 32)
    assert c.lookup(b) == (32, b"y" * 32)
    # ...and the long one gets the deepest entry, leaving a token to run.
    assert c.lookup(a) == (96, b"x" * 96)
    assert c.lookup(a[:97])[0] == 96 and c.lookup(a[:96])[0] == 32
    assert c.hits == 4 and c.hit_tokens == 96 + 32 + 96 + 32


def test_lru_eviction_under_the_budget_prunes_the_tree() -> None:
    c = PrefixCache(budget_bytes=100)
    prompts = [[i] * (2 * BLOCK + 1) for i in range(4)]
    for p in prompts[:3]:
        c.store(p, 2 * BLOCK, b"z" * 40)
    assert c.entries == 2 and c.bytes_used == 80  # the first one was evicted
    assert c.lookup(prompts[0]) == (0, None)
    c.lookup(prompts[1])  # now the most recent
    c.store(prompts[3], 2 * BLOCK, b"z" * 40)
    assert c.lookup(prompts[2]) == (0, None) and c.lookup(prompts[1])[0] == 2 * BLOCK
    assert len(c._root.children) == 2  # evicted branches are gone
    c.store(prompts[0], 2 * BLOCK, b"w" * 500)  # larger than the budget: not kept
    assert c.lookup(prompts[0]) == (0, None)


SYSTEM = (
    "You are a careful assistant. You answer briefly and exactly, you never invent facts, "
    "and when you do not know something you say so plainly. "
) * 4


def test_shared_system_prompt_is_prefilled_once(model_path: Path) -> None:
    greedy = SamplerConfig.greedy()
    questions = ["What is 2+2?", "Name a colour.", "Capital of Italy?"]
    lone = Engine(model_path, context_size=512, threads=2)
    want = []
    for q in questions:
        lone.reset()
        toks = lone.tokenize(SYSTEM + q, add_special=True)
        want.append(lone.generate(toks, 10, sampler=greedy, ignore_eos=True).tokens)

    async def main() -> tuple[list[list[int]], dict[str, float | int]]:
        async with AsyncEngine(model_path, context_size=512, threads=2) as e:
            got = []
            for q in questions:
                out = await e.generate(e.tokenize(SYSTEM + q), 10, sampler=greedy, ignore_eos=True)
                got.append(out.tokens)
            return got, e.metrics()

    got, m = asyncio.run(main())
    assert got == want
    assert m["prefix_cache_hits"] == 2 and m["prefix_cache_misses"] == 1
    n_system = len(lone.tokenize(SYSTEM, add_special=True))
    assert m["prefix_cache_hit_tokens"] >= 2 * (n_system - BLOCK)
    # Only the first request paid for the system prompt.
    assert m["prompt_tokens"] < n_system + 3 * (BLOCK + 12)
