"""Forks of a live session (`Engine.fork`, `AsyncSession.fork`): each
continues exactly as an independent copy of the session would, and shares
the parent's KV pages copy on write until it writes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from oxillama import AsyncEngine, Engine, OxiLlamaError, SamplerConfig

PROMPT = "The old lighthouse keeper climbed the stairs each night and"
SAMPLING = SamplerConfig(temperature=0.9, top_k=40, seed=1234)


@pytest.fixture(scope="module")
def smol_path(model_path: Path) -> Path:
    return model_path


def test_engine_fork_continues_as_a_copy_would(smol_path: Path) -> None:
    parent = Engine(smol_path, context_size=512, kv_positions=1024, sampler=SAMPLING, threads=2)
    parent.generate(PROMPT, 10)
    blob = parent.snapshot_bytes()
    free = parent._session.pool_free_pages
    held = parent._session.pages_held
    fork = parent.fork()
    # Nothing copied: the fork holds the parent's pages.
    assert fork._session.pages_held == held
    assert parent._session.pool_free_pages == free
    assert fork.tokens == parent.tokens and fork.n_past == parent.n_past

    # Sampled (the RNG state travels), each continuing on its own.
    a = parent.generate(" Then", 12).tokens
    b = fork.generate(" Suddenly", 12).tokens
    assert a == Engine.restore_bytes(blob).generate(" Then", 12).tokens
    assert b == Engine.restore_bytes(blob).generate(" Suddenly", 12).tokens
    # Diverging took pages of the pool, no more than the new positions need
    # plus the shared page each copied on its first write.
    used = free - parent._session.pool_free_pages
    assert 0 < used <= 2 * (1 + -(-13 // 16))

    # A fork snapshots on its own and its snapshot continues as it does.
    again = Engine.restore_bytes(fork.snapshot_bytes())
    assert again.generate(" and", 8).tokens == fork.generate(" and", 8).tokens


def test_fork_of_a_fork_and_greedy_parent_unchanged(smol_path: Path) -> None:
    parent = Engine(
        smol_path, context_size=256, kv_positions=1024, sampler=SamplerConfig.greedy(), threads=2
    )
    parent.generate(PROMPT, 6)
    blob = parent.snapshot_bytes()
    forks = [parent.fork()]
    forks.append(forks[0].fork())
    outs = [f.generate(f" question {i}:", 8).tokens for i, f in enumerate(forks)]
    for i, out in enumerate(outs):
        assert out == Engine.restore_bytes(blob).generate(f" question {i}:", 8).tokens
    # The parent, forked twice over, continues as if it never was.
    assert parent.generate(" Finally", 8).tokens == (
        Engine.restore_bytes(blob).generate(" Finally", 8).tokens
    )


def test_a_full_pool_is_a_clear_error(smol_path: Path) -> None:
    # Without kv_positions the forks share the context's own pool, as
    # llama.cpp's sequences share one context's cells.
    parent = Engine(smol_path, context_size=64, sampler=SamplerConfig.greedy(), threads=2)
    parent.eval(parent.tokenize(PROMPT * 3)[:60])
    fork = parent.fork()
    with pytest.raises(OxiLlamaError, match=r"(?i)pool"):
        fork.generate(" more", 4, ignore_eos=True)
        parent.generate(" more", 4, ignore_eos=True)


def test_kv_positions_is_checked(smol_path: Path) -> None:
    with pytest.raises(OxiLlamaError, match="kv_positions"):
        Engine(smol_path, context_size=256, kv_positions=100)


def test_async_session_fork_shares_pages(smol_path: Path) -> None:
    async def run() -> None:
        async with AsyncEngine(smol_path, context_size=512, threads=2) as ae:
            s = ae.session(sampler=SAMPLING)
            await s.generate(PROMPT * 4, 6)
            blob = await s.snapshot_bytes()
            pool = ae.scheduler._pool
            free = pool.free_pages
            forks = [await s.fork() for _ in range(4)]
            assert pool.free_pages == free
            questions = [f" Question {i}:" for i in range(4)]
            outs = await asyncio.gather(
                *(f.generate(q, 8) for f, q in zip(forks, questions, strict=True))
            )
            # Four branches of 8-9 new positions: at most the copied last
            # page and one more page each.
            assert free - pool.free_pages <= 4 * 2
            for q, out in zip(questions, outs, strict=True):
                assert out.tokens == Engine.restore_bytes(blob).generate(q, 8).tokens
            mine = await s.generate(" Meanwhile", 8)
            assert mine.tokens == Engine.restore_bytes(blob).generate(" Meanwhile", 8).tokens
            for f in forks:
                await f.close()

    asyncio.run(run())
