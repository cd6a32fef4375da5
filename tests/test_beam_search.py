"""Beam search: width 1 is greedy decoding, a wide search on a tiny model
equals an exhaustive search, scores follow ``logprob_sum / len **
length_penalty`` with sums that are the model's own log-probabilities, and
beams share their KV pages."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import numpy as np
import pytest

from oxillama import AsyncEngine, Engine, ParameterError, SamplerConfig, _native
from oxillama.decoding.beam import score
from tests.oracle.llama_f64 import log_softmax

FIXTURE = Path(__file__).parent / "models" / "fixtures" / "llama.gguf"


@pytest.mark.parametrize("prompt", ["The capital of France is", "def add(a, b):", "Once upon"])
def test_width_one_is_greedy(engine: Engine, prompt: str) -> None:
    greedy = engine.generate(prompt, 10, sampler=SamplerConfig.greedy())
    (beam,) = engine.beam_search(prompt, beam_width=1, max_tokens=10)
    assert beam.tokens == greedy.tokens and beam.text == greedy.text


def test_scores_follow_the_formula_and_sums_are_model_logprobs(engine: Engine) -> None:
    prompt = "My favourite fruit is"
    beams = engine.beam_search(prompt, beam_width=3, max_tokens=6, length_penalty=0.7)
    assert len(beams) == 3
    assert [b.score for b in beams] == sorted((b.score for b in beams), reverse=True)
    toks = engine.tokenize(prompt, add_special=True)
    for b in beams:
        assert b.score == pytest.approx(score(b.logprob_sum, len(b.tokens), 0.7))
        assert b.score == pytest.approx(b.logprob_sum / len(b.tokens) ** 0.7)
        engine.reset()
        rows = engine.eval(toks + b.tokens, all_logits=True)
        want = sum(log_softmax(rows[len(toks) - 1 + i])[t] for i, t in enumerate(b.tokens))
        assert b.logprob_sum == pytest.approx(want, abs=2e-3)


def exhaustive(e: Engine, toks: list[int], length: int) -> list[tuple[float, tuple[int, ...]]]:
    """Every hypothesis up to ``length`` tokens (one ended by an
    end-of-generation token stops there), with its log-probability."""
    eog = e.tokenizer.eog_ids
    out: list[tuple[float, tuple[int, ...]]] = []

    def walk(prefix: tuple[int, ...], lp: float) -> None:
        e.reset()
        row = log_softmax(e.eval(toks + list(prefix)))
        for t in range(e.vocab_size):
            if t in eog:
                out.append((lp + row[t], prefix))
            elif len(prefix) + 1 == length:
                out.append((lp + row[t], (*prefix, t)))
            else:
                walk((*prefix, t), lp + row[t])

    walk((), 0.0)
    return sorted(out, key=lambda x: -x[0])


def test_a_search_as_wide_as_the_vocabulary_equals_exhaustive_search() -> None:
    e = Engine(FIXTURE, context_size=64, threads=1, sampler=SamplerConfig.greedy())
    toks = e.tokenize("the cat", add_special=True)
    want = exhaustive(e, toks, 2)
    beams = e.beam_search(
        toks, beam_width=e.vocab_size, max_tokens=2, length_penalty=0.0, early_stopping=False
    )
    got = [(b.logprob_sum, tuple(b.tokens)) for b in beams[:8]]
    for (glp, gt), (wlp, wt) in zip(got, want[:8], strict=True):
        assert gt == wt and glp == pytest.approx(wlp, abs=1e-3)


def test_a_narrow_search_finds_the_exhaustive_top_k_when_it_starts_there() -> None:
    """Width 4 over 3 tokens: wherever the exhaustive top 4 go through the
    step-wise top 4 (checked, so the test means what it says), they agree."""
    e = Engine(FIXTURE, context_size=64, threads=1, sampler=SamplerConfig.greedy())
    toks = e.tokenize("a b", add_special=True)
    full = exhaustive(e, toks, 2)
    e.reset()
    first = np.argsort(-log_softmax(e.eval(toks)))[:4]
    top4 = full[:4]
    assert all(not t or t[0] in first for _, t in top4), "pick a prompt where this holds"
    beams = e.beam_search(toks, beam_width=4, max_tokens=2, length_penalty=0.0)
    assert [tuple(b.tokens) for b in beams] == [t for _, t in top4]
    assert all(a.score >= b.score for a, b in itertools.pairwise(beams))


def test_beams_share_pages(engine: Engine) -> None:
    prompt = "Summarize: " + "the river runs to the sea and the sea runs to the sky. " * 4
    n_prompt = len(engine.tokenize(prompt, add_special=True))
    beams = engine.beam_search(prompt, beam_width=4, max_tokens=24, early_stopping=False)
    assert len(beams) == 4
    page = _native.KvPool(engine.model.native, 1).page_size
    single = -(-(n_prompt + 24) // page)
    search = engine._last_beam
    assert search is not None and search.peak_pages > 0
    # Four beams of a long prompt hold little more than one sequence.
    assert search.peak_pages < 4 * single
    assert search.peak_pages <= single + 4 * (-(-24 // page) + 1)


def test_bad_arguments_are_refused(engine: Engine) -> None:
    for kw in ({"beam_width": 0}, {"max_tokens": 0}, {"length_penalty": float("nan")}):
        with pytest.raises(ParameterError):
            engine.beam_search("Hi", **kw)  # type: ignore[arg-type]


def test_async_beam_search_runs_beside_streams(model_path: Path, engine: Engine) -> None:
    want = engine.beam_search("Water boils at", beam_width=3, max_tokens=8)

    async def run() -> tuple[list[list[int]], str]:
        async with AsyncEngine(model_path, context_size=256, threads=2) as ai:
            other = asyncio.create_task(
                ai.generate("Once upon a time", 16, sampler=SamplerConfig.greedy())
            )
            beams = await ai.beam_search("Water boils at", beam_width=3, max_tokens=8)
            return [b.tokens for b in beams], (await other).text

    got, text = asyncio.run(run())
    assert got == [b.tokens for b in want]
    assert text == engine.generate("Once upon a time", 16, sampler=SamplerConfig.greedy()).text
