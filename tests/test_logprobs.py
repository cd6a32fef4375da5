"""Per-token log-probabilities (``generate(..., logprobs=k)``) against a
float64 ``log_softmax`` of the engine's own logits, and ``n`` choices of
one prompt that evaluate it once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxillama import (
    AsyncEngine,
    Engine,
    OverloadedError,
    ParameterError,
    Piece,
    SamplerConfig,
    _native,
)
from tests.oracle.llama_f64 import log_softmax

PROMPT = "The three primary colors are"


def test_logprobs_are_the_log_softmax_of_the_engines_logits(engine: Engine) -> None:
    k = 5
    out = engine.generate(PROMPT, 12, logprobs=k)
    assert out.logprobs is not None and len(out.logprobs) == len(out.tokens) == 12
    # Replay the same tokens and read the logits each was sampled from.
    engine.reset()
    rows = engine.eval(engine.tokenize(PROMPT), all_logits=True)
    logits = [rows[-1]]
    for t in out.tokens[:-1]:
        logits.append(engine.eval([t]))
    for entry, tok, row in zip(out.logprobs, out.tokens, logits, strict=True):
        want = log_softmax(row)
        assert entry.token == tok
        assert entry.bytes == engine.tokenizer.token_to_piece(tok)
        assert abs(entry.logprob - want[tok]) < 1e-4
        ids = [i for i, _ in entry.top]
        assert ids == list(np.argsort(-want, kind="stable")[:k])
        assert [lp for _, lp in entry.top] == sorted((lp for _, lp in entry.top), reverse=True)
        assert all(abs(lp - want[i]) < 1e-4 for i, lp in entry.top)
        # Greedy picks the most likely token, so it heads its own list.
        assert ids[0] == tok


def test_no_logprobs_unless_asked_and_bad_values_are_refused(engine: Engine) -> None:
    assert engine.generate(PROMPT, 2).logprobs is None
    assert engine.generate("", 2, logprobs=0).logprobs is not None
    for bad in (-1, 21, 2.5, True, "3"):
        with pytest.raises(ParameterError, match="logprobs"):
            engine.generate(PROMPT, 2, logprobs=bad)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-30, 30, allow_nan=False, width=32), min_size=2, max_size=300),
    st.integers(0, 25),
    st.data(),
)
def test_native_logprobs_match_float64(values: list[float], k: int, data: st.DataObject) -> None:
    x = np.array(values, dtype=np.float32)
    tok = data.draw(st.integers(0, len(values) - 1))
    lp, top = _native.logprobs(x, tok, k)
    want = log_softmax(x)
    assert abs(lp - want[tok]) < 1e-5
    order = sorted(range(len(x)), key=lambda i: (-x[i], i))[:k]
    assert [i for i, _ in top] == order


def test_native_logprobs_refuse_bad_tokens() -> None:
    x = np.zeros(4, dtype=np.float32)
    for bad in (-1, 4):
        with pytest.raises(ValueError, match="outside"):
            _native.logprobs(x, bad, 1)


def test_async_logprobs_and_pieces_match_the_engine(model_path: Path, engine: Engine) -> None:
    want = engine.generate(PROMPT, 10, logprobs=3)
    assert want.logprobs is not None

    async def run() -> tuple[list[Piece], list[float]]:
        async with AsyncEngine(model_path, context_size=256, threads=2) as ai:
            g = SamplerConfig.greedy()
            done = await ai.generate(PROMPT, 10, sampler=g, logprobs=3)
            assert done.logprobs is not None
            pieces = [p async for p in ai.stream(PROMPT, 10, sampler=g, logprobs=3)]
            return pieces, [t.logprob for t in done.logprobs]  # type: ignore[misc]

    pieces, lps = asyncio.run(run())
    assert [t.token for t in want.logprobs] == [t.token for p in pieces for t in p.logprobs]
    assert np.allclose(lps, [t.logprob for t in want.logprobs], atol=1e-4)
    assert all(isinstance(p, Piece) for p in pieces)


def test_n_choices_share_the_prompt_and_greedy_choices_agree(model_path: Path) -> None:
    prompt = "Write a haiku about the sea. " * 6  # several KV pages

    async def run() -> tuple[list[list[int]], list[list[int]], dict[str, float | int], int]:
        async with AsyncEngine(model_path, context_size=512, threads=2, max_batch=8) as ai:
            greedy = await ai.generate_n(prompt, 3, 8, sampler=SamplerConfig.greedy())
            seeded = await ai.generate_n(
                prompt, 3, 8, sampler=SamplerConfig(temperature=1.0, seed=11)
            )
            one = await ai.generate(prompt, 8, sampler=SamplerConfig(temperature=1.0, seed=12))
            assert seeded[1].tokens == one.tokens  # choice 1 of seed 11 samples with 12
            assert [o.seed for o in seeded] == [11, 12, 13]
            n = len(ai.tokenize(prompt))
            return [o.tokens for o in greedy], [o.tokens for o in seeded], ai.metrics(), n

    greedy, seeded, m, n = asyncio.run(run())
    assert greedy[0] == greedy[1] == greedy[2]
    assert len({tuple(t) for t in seeded}) > 1
    # In each call two followers started from the leader's prompt KV, and
    # only the leaders' prompts (and the lone request's) were evaluated.
    assert m["shared_prompt_tokens"] == 2 * 2 * n
    assert m["prompt_tokens"] <= 3 * n


def test_n_choices_share_a_prompt_the_worker_finished_before_they_queued(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``generate_n`` queues its choices one event-loop step apart; on a
    busy machine the worker can finish the leader's prompt in between. The
    followers still start from its KV, and the fork goes back to the pool
    after the call; choices that never queue release it too."""
    from oxillama.serving.scheduler import PromptShare, Scheduler

    prompt = "Write a haiku about the sea. " * 6
    shares: list[PromptShare] = []
    submit = Scheduler.submit

    def late_followers(self: Scheduler, *a: Any, **kw: Any) -> Any:
        sh = kw.get("share")
        if sh is not None and sh.leader is not None:  # a follower
            if sh not in shares:
                shares.append(sh)
            deadline = time.monotonic() + 30
            while not sh.ready() and time.monotonic() < deadline:
                time.sleep(0.001)  # blocks the loop: only the worker runs
            assert sh.kv is not None, "the leader dropped the prompt it was promised"
            if a[1] == 7:
                raise OverloadedError("this follower never queues")
        return submit(self, *a, **kw)

    monkeypatch.setattr(Scheduler, "submit", late_followers)

    async def run() -> tuple[list[list[int]], dict[str, float | int], int, int]:
        async with AsyncEngine(model_path, context_size=512, threads=2, max_batch=8) as ai:
            await ai.generate(prompt, 1)  # the prefix cache keeps its pages from here on
            free = int(ai.metrics()["kv_pages_free"])
            outs = await ai.generate_n(prompt, 3, 8, sampler=SamplerConfig.greedy())
            with pytest.raises(OverloadedError):
                await ai.generate_n(prompt, 2, 7, sampler=SamplerConfig.greedy())
            for _ in range(3000):  # the failed call's leader runs on
                if int(ai.metrics()["kv_pages_free"]) == free:
                    break
                await asyncio.sleep(0.01)
            return [o.tokens for o in outs], ai.metrics(), len(ai.tokenize(prompt)), free

    tokens, m, n, free = asyncio.run(run())
    assert tokens[0] == tokens[1] == tokens[2]
    assert m["shared_prompt_tokens"] == 2 * n
    assert len(shares) == 2 and all(sh.kv is None for sh in shares)
    assert int(m["kv_pages_free"]) == free


def test_n_must_be_positive(model_path: Path) -> None:
    async def run() -> None:
        async with AsyncEngine(model_path, context_size=256, threads=2) as ai:
            with pytest.raises(ParameterError, match="n must be"):
                await ai.generate_n("Hi", 0, 2)

    asyncio.run(run())
