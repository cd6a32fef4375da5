"""Context shift on every way a generation reaches the context size, not
only session turns: one-shot requests through the batching scheduler
(``AsyncEngine`` and ``oxillama serve --context-shift``, completions and
chat) shift as :class:`~oxillama.Engine` does, token for token under greedy
decoding, also with n-gram drafts, several choices, a grammar, and when a
request that already shifted is preempted and recomputed; speculative
decoding and beam search, which do not shift, refuse the policy by name
instead of ending at the context size."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from oxillama import (
    Engine,
    GenerateError,
    NgramDraft,
    ParameterError,
    SpeculativeEngine,
)
from oxillama.serving.scheduler import Request, Scheduler
from tests._context_shift import N_CTX, served, shifted, shifted_async

PROMPTS = [
    "1, 2, 3,",
    "The quick brown fox jumps over the lazy dog. Once upon a time there was a",
    "def fib(n):\n    ",
]
#: Generated tokens per request: more than two contexts' worth.
N = 140
GRAMMAR = 'root ::= ("one" | "two" | "three") (", " ("one" | "two" | "three"))* "."'


@pytest.fixture(scope="module")
def prompt_ids(model_path: Path) -> list[list[int]]:
    e = Engine(model_path, context_size=N_CTX)
    return [e.tokenize(p, add_special=True) for p in PROMPTS]


@pytest.fixture(scope="module")
def want(model_path: Path, prompt_ids: list[list[int]]) -> list[list[int]]:
    """What a synchronous engine with the same shift generates."""
    out = []
    for ids in prompt_ids:
        e = shifted(model_path)
        c = e.generate(ids, N, ignore_eos=True)
        assert len(c.tokens) == N and e.context_shifts >= 2
        out.append(c.tokens)
    return out


def test_engine_generate_and_stream_shift_alike(
    model_path: Path, prompt_ids: list[list[int]], want: list[list[int]]
) -> None:
    e = shifted(model_path)
    text = "".join(e.stream(prompt_ids[0], N, ignore_eos=True))
    assert e.tokens[-5:] == want[0][-5:] and e.context_shifts >= 2
    assert text == e.detokenize(want[0])


def test_one_shot_requests_shift_as_the_engine(
    model_path: Path, prompt_ids: list[list[int]], want: list[list[int]]
) -> None:
    """Concurrent one-shot requests (batched), their streamed form, n-gram
    drafts and several choices of one prompt (which share its pages: the
    shift copies them first) all give the engine's tokens, past the
    context size, with honest counts."""

    async def main() -> dict[str, Any]:
        async with shifted_async(model_path) as a:
            plain = await asyncio.gather(*(a.generate(i, N, ignore_eos=True) for i in prompt_ids))
            result: list[Any] = []
            streamed = "".join(
                [p async for p in a.stream(prompt_ids[1], N, ignore_eos=True, result=result)]
            )
            drafted = await asyncio.gather(
                *(a.generate(i, N, ignore_eos=True, speculative="ngram") for i in prompt_ids)
            )
            choices = await a.generate_n(prompt_ids[2], 3, N, ignore_eos=True)
            return {
                "plain": plain,
                "streamed": (streamed, result[0]),
                "drafted": drafted,
                "choices": choices,
                "metrics": a.metrics(),
            }

    got = asyncio.run(main())
    for out, ids, w in zip(got["plain"], prompt_ids, want, strict=True):
        assert out.tokens == w
        assert out.finish_reason == "length"
        assert out.timings.prompt_tokens == len(ids) and out.timings.decode_tokens == N
    text, done = got["streamed"]
    assert done.tokens == want[1] and text == done.text and done.finish_reason == "length"
    assert [c.tokens for c in got["drafted"]] == want
    assert [c.tokens for c in got["choices"]] == [want[2]] * 3
    m = got["metrics"]
    assert m["speculative_accepted_tokens"] > 0 and m["shared_prompt_tokens"] > 0


def test_a_grammar_keeps_its_whole_budget_under_a_shift(model_path: Path) -> None:
    """The grammar budget is max_tokens, not what is left of the context,
    when the context shifts (as in the engine): the text closes at the
    same token."""
    prompt = "Count in words: one, two, three, four, five, six, seven, eight, nine, ten,"
    e = shifted(model_path)
    ids = e.tokenize(prompt, add_special=True)
    ref = e.generate(ids, 90, grammar=GRAMMAR)
    assert e.context_shifts >= 1

    async def main() -> Any:
        async with shifted_async(model_path) as a:
            return await a.generate(ids, 90, grammar=GRAMMAR)

    out = asyncio.run(main())
    assert (out.tokens, out.text, out.finish_reason) == (ref.tokens, ref.text, ref.finish_reason)


def test_shifted_requests_preempted_and_recomputed_stay_exact(
    model_path: Path,
    prompt_ids: list[list[int]],
    want: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once it has shifted, every request is preempted every ninth token
    (as the pool's pressure may do at any step), plain and with n-gram
    drafts. A preempted request is recomputed with its shifts at the same
    points, so every output is still the engine's (recomputing the shifted
    tokens as one context, or the whole history without shifts, would not
    be)."""
    forced: set[tuple[int, int]] = set()
    sample = Scheduler._sample

    def preempting(self: Scheduler, s: Request) -> int | None:
        at = (s.id, len(s.generated))
        if s.window is not None and not s.spec_extra and at[1] % 9 == 0 and at not in forced:
            forced.add(at)
            self._preempt(s)
            return None
        return sample(self, s)

    monkeypatch.setattr(Scheduler, "_sample", preempting)

    async def main(**kw: Any) -> list[list[int]]:
        async with shifted_async(model_path, prefill_chunk=8) as a:
            outs = await asyncio.gather(
                *(a.generate(i, N, ignore_eos=True, **kw) for i in prompt_ids)
            )
            return [o.tokens for o in outs]

    assert asyncio.run(main()) == want
    assert len(forced) >= 5 * len(prompt_ids)
    forced.clear()
    assert asyncio.run(main(speculative="ngram")) == want
    assert len(forced) >= 3 * len(prompt_ids)


def test_pool_pressure_preempts_shifted_requests_exactly(
    model_path: Path,
    prompt_ids: list[list[int]],
    want: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seven pages for two requests of four pages each at full context:
    the newer one is preempted for the older one's pages, also after it
    shifted, and still gives the engine's tokens."""
    after_shift: list[bool] = []
    preempt = Scheduler._preempt

    def counting(self: Scheduler, s: Request) -> None:
        after_shift.append(s.window is not None)
        preempt(self, s)

    monkeypatch.setattr(Scheduler, "_preempt", counting)

    async def main() -> list[list[int]]:
        async with shifted_async(model_path, kv_pages=7) as a:
            outs = await asyncio.gather(
                *(a.generate(i, N, ignore_eos=True) for i in prompt_ids[:2])
            )
            return [o.tokens for o in outs]

    assert asyncio.run(main()) == want[:2]
    assert any(after_shift), after_shift


def test_a_prompt_may_fill_the_context_when_it_shifts(model_path: Path) -> None:
    e = shifted(model_path)
    ids = (e.tokenize(PROMPTS[1], add_special=True) * 4)[:N_CTX]
    ref = e.generate(ids, 30, ignore_eos=True)

    async def main(shift: bool) -> Any:
        async with shifted_async(model_path, shift) as a:
            return await a.generate(ids, 30, ignore_eos=True)

    assert asyncio.run(main(True)).tokens == ref.tokens
    with pytest.raises(GenerateError, match="at least one must be left"):
        asyncio.run(main(False))
    # One token more does not fit even with the shift, and says why.
    ids = ids + ids[1:2]
    with pytest.raises(GenerateError, match="makes room for generated tokens"):
        asyncio.run(main(True))


@pytest.fixture(scope="module")
def client(model_path: Path) -> Iterator[openai.OpenAI]:
    yield from served(model_path, shift=True)


def test_served_completions_shift_as_the_engine(model_path: Path, client: openai.OpenAI) -> None:
    """``oxillama serve --context-shift``: a one-shot completion (whole or
    streamed) runs past the context size, gives the engine's text and
    counts every token; max_tokens is at most the context size, so the
    prompt is long enough that the two together overflow it twice."""
    prompt = PROMPTS[1] + " little house in the middle of a big dark forest, and in it lived"
    e = shifted(model_path)
    ids = e.tokenize(prompt, add_special=True)
    ref = e.generate(ids, N_CTX, ignore_eos=True)
    assert e.context_shifts >= 2
    extra = {"ignore_eos": True}
    out = client.completions.create(
        model="m", prompt=prompt, max_tokens=N_CTX, temperature=0, extra_body=extra
    )
    assert out.choices[0].text == ref.text
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ids), N_CTX)
    chunks = list(
        client.completions.create(
            model="m",
            prompt=prompt,
            max_tokens=N_CTX,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == N_CTX


def test_served_chat_shifts_as_the_engine(model_path: Path, client: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "Tell me a long story about a dragon."}]
    e = shifted(model_path)
    ref = e.chat(messages, N_CTX, ignore_eos=True)
    assert e.context_shifts >= 1
    out = client.chat.completions.create(
        model="m",
        messages=messages,
        max_tokens=N_CTX,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert out.choices[0].message.content == ref.text
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == N_CTX


def test_speculative_decoding_refuses_a_context_shift(model_path: Path) -> None:
    plain = Engine(model_path, context_size=N_CTX, threads=2)
    with pytest.raises(ParameterError, match="context shift is not supported with speculative"):
        SpeculativeEngine(shifted(model_path), NgramDraft())
    with pytest.raises(ParameterError, match="target engine has context_shift=True"):
        SpeculativeEngine(shifted(model_path), plain)
    with pytest.raises(ParameterError, match="draft engine has context_shift=True"):
        SpeculativeEngine(plain, shifted(model_path))
    assert SpeculativeEngine(plain, NgramDraft()).target is plain


def test_beam_search_refuses_to_reach_the_context_under_a_shift(
    model_path: Path, prompt_ids: list[list[int]]
) -> None:
    """Beams do not shift: an engine with a context shift refuses a search
    that would reach the context size rather than cut it there; a search
    that fits runs as without one."""
    ids = prompt_ids[0]
    room = N_CTX - len(ids)
    e = shifted(model_path)
    with pytest.raises(ParameterError, match="context shift is not supported with beam search"):
        e.beam_search(ids, beam_width=2, max_tokens=room + 1)
    fits = e.beam_search(ids, beam_width=2, max_tokens=room)
    plain = Engine(model_path, context_size=N_CTX, threads=2)
    assert fits == plain.beam_search(ids, beam_width=2, max_tokens=room)
    # Without a shift the search still ends at the context size.
    assert all(len(b.tokens) <= room for b in plain.beam_search(ids, max_tokens=room + 10))

    async def main() -> None:
        async with shifted_async(model_path) as a:
            with pytest.raises(ParameterError, match="not supported with beam search"):
                await a.beam_search(ids, beam_width=2, max_tokens=room + 1)

    asyncio.run(main())


@pytest.fixture(scope="module")
def unshifted_client(model_path: Path) -> Iterator[openai.OpenAI]:
    yield from served(model_path, shift=False)


def test_a_served_prompt_may_fill_the_context_when_it_shifts(
    model_path: Path, client: openai.OpenAI, unshifted_client: openai.OpenAI
) -> None:
    """As ``Engine``: under ``--context-shift`` a prompt of exactly the
    context size is served (the first generated token shifts), one token
    longer is refused by name; without the shift the full prompt is
    refused as before."""
    e = shifted(model_path)
    ids = (e.tokenize(PROMPTS[1], add_special=True) * 4)[:N_CTX]
    ref = e.generate(ids, 30, ignore_eos=True)
    assert e.context_shifts >= 1
    out = client.completions.create(
        model="m", prompt=ids, max_tokens=30, temperature=0, extra_body={"ignore_eos": True}
    )
    assert out.choices[0].text == ref.text
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (N_CTX, 30)
    # Token ids beyond what may be served fail the request schema, a text
    # that tokenizes beyond it the context check; both name the prompt.
    long_text = " ".join([PROMPTS[1]] * 5)
    assert len(e.tokenize(long_text, add_special=True)) > N_CTX
    for c, ask in ((client, ids + ids[1:2]), (unshifted_client, ids)):
        with pytest.raises(openai.BadRequestError) as err:
            c.completions.create(model="m", prompt=ask, max_tokens=4, temperature=0)
        assert "'param': 'prompt'" in str(err.value)
    for c in (client, unshifted_client):
        with pytest.raises(openai.BadRequestError) as err:
            c.completions.create(model="m", prompt=long_text, max_tokens=4, temperature=0)
        assert "context_length_exceeded" in str(err.value)


def test_a_served_generation_may_run_past_the_context_when_it_shifts(
    model_path: Path,
    client: openai.OpenAI,
    unshifted_client: openai.OpenAI,
    prompt_ids: list[list[int]],
    want: list[list[int]],
) -> None:
    """``max_tokens`` above the context size: more than two contexts'
    worth of tokens, the engine's own, streamed or not; without the
    shift the same request is refused by the schema."""
    text = Engine(model_path, context_size=N_CTX).detokenize(want[0])
    extra = {"ignore_eos": True}
    out = client.completions.create(
        model="m", prompt=prompt_ids[0], max_tokens=N, temperature=0, extra_body=extra
    )
    assert out.choices[0].text == text
    assert out.usage is not None and out.usage.completion_tokens == N
    chunks = client.completions.create(
        model="m", prompt=prompt_ids[0], max_tokens=N, temperature=0, stream=True, extra_body=extra
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    with pytest.raises(openai.BadRequestError) as err:
        unshifted_client.completions.create(
            model="m", prompt=prompt_ids[0], max_tokens=N_CTX + 1, temperature=0
        )
    assert "max_tokens" in str(err.value)
