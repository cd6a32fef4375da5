"""``oxillama serve --context-shift`` and prompts at the context size, over
HTTP: a prompt (text, token ids or a rendered chat) that fills the context
is served with the tokens ``AsyncEngine`` and ``Engine`` give it under the
same shift (greedy, whole and streamed, completions and chat), and one
token more is refused by name, as both engines refuse it. Without the
shift a full prompt is refused by name, as before."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from oxillama import Engine, GenerateError, SamplerConfig
from tests._context_shift import N_CTX, served, shifted_async
from tests._context_shift import shifted as shifted_engine

#: Tokens generated per request: the first one shifts the full context,
#: and another shift follows (4 kept + 30 left after the first).
M = 40
WORDS = (
    "Tell me a long story about a dragon who guards a mountain of gold and a small village below it"
).split()


def _words(n: int) -> str:
    return " ".join((WORDS * (n // len(WORDS) + 1))[:n])


def _chat(n: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": _words(n)}]


@pytest.fixture(scope="module")
def tokenizer(model_path: Path) -> Engine:
    return Engine(model_path, context_size=N_CTX, threads=2)


def _fill(tokens_of: Any) -> int:
    """The smallest word count whose prompt has ``N_CTX`` tokens."""
    for n in range(1, 4 * N_CTX):
        if len(tokens_of(n)) >= N_CTX:
            assert len(tokens_of(n)) == N_CTX, "no word count fills the context exactly"
            return n
    raise AssertionError("no prompt of up to four contexts' words fills the context")


@pytest.fixture(scope="module")
def prompts(tokenizer: Engine) -> dict[str, Any]:
    """A text and a chat of exactly ``N_CTX`` tokens, and one token longer."""
    e = tokenizer

    def text_ids(n: int) -> list[int]:
        return e.tokenize(_words(n), add_special=True)

    def chat_ids(n: int) -> list[int]:
        return e.tokenize(e.apply_chat_template(_chat(n)), add_special=True)

    t, c = _fill(text_ids), _fill(chat_ids)
    assert len(text_ids(t + 1)) == len(chat_ids(c + 1)) == N_CTX + 1
    return {
        "text": _words(t),
        "text_ids": text_ids(t),
        "long_text": _words(t + 1),
        "chat": _chat(c),
        "chat_ids": chat_ids(c),
        "long_chat": _chat(c + 1),
    }


@pytest.fixture(scope="module")
def shifted(model_path: Path) -> Iterator[openai.OpenAI]:
    yield from served(model_path, shift=True)


@pytest.fixture(scope="module")
def unshifted(model_path: Path) -> Iterator[openai.OpenAI]:
    yield from served(model_path, shift=False)


@pytest.fixture(scope="module")
def want(model_path: Path, prompts: dict[str, Any]) -> dict[str, list[int]]:
    """What ``AsyncEngine(context_shift=True, n_keep=KEEP)`` generates for
    the full prompts (the server's settings), checked against a
    synchronous ``Engine`` with the same shift."""

    async def main() -> dict[str, list[int]]:
        async with shifted_async(model_path) as a:
            out = {}
            for key in ("text_ids", "chat_ids"):
                c = await a.generate(prompts[key], M, ignore_eos=True)
                assert c.finish_reason == "length"
                out[key] = c.tokens
                # A prompt one token longer is refused, as the engine does.
                with pytest.raises(GenerateError, match="does not fit"):
                    await a.generate(prompts[key] + prompts[key][-1:], M)
            return out

    got = asyncio.run(main())
    for key, tokens in got.items():
        e = shifted_engine(model_path)
        assert e.generate(prompts[key], M, ignore_eos=True).tokens == tokens
        assert e.context_shifts >= 2
        with pytest.raises(GenerateError, match="does not fit"):
            e.reset()
            e.generate(prompts[key] + prompts[key][-1:], M)
    return got


def _pieces(e: Engine, tokens: list[int]) -> list[bytes]:
    return [e.tokenizer.token_to_piece(t) for t in tokens]


def test_a_served_text_prompt_may_fill_the_context_when_it_shifts(
    shifted: openai.OpenAI, tokenizer: Engine, prompts: dict[str, Any], want: dict[str, Any]
) -> None:
    """A completion whose text prompt tokenizes to exactly the context
    size: the engine's tokens one by one (``logprobs``), its text whole,
    streamed and as two streamed choices, with honest counts."""
    ref = want["text_ids"]
    text = tokenizer.detokenize(ref)
    extra = {"ignore_eos": True}
    out = shifted.completions.create(
        model="m", prompt=prompts["text"], max_tokens=M, temperature=0, logprobs=0, extra_body=extra
    )
    choice = out.choices[0]
    assert choice.logprobs is not None and choice.logprobs.tokens is not None
    assert choice.logprobs.tokens == [p.decode(errors="replace") for p in _pieces(tokenizer, ref)]
    assert (choice.text, choice.finish_reason) == (text, "length")
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (N_CTX, M)
    chunks = list(
        shifted.completions.create(
            model="m",
            prompt=prompts["text"],
            max_tokens=M,
            temperature=0,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
    )
    for i in range(2):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert "".join(c.text for c in mine) == text
        assert mine[-1].finish_reason == "length"
    usage = chunks[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (N_CTX, 2 * M)


def test_a_served_chat_may_fill_the_context_when_it_shifts(
    shifted: openai.OpenAI, tokenizer: Engine, prompts: dict[str, Any], want: dict[str, Any]
) -> None:
    """A chat whose rendered template is exactly the context size: the
    engine's tokens one by one (their bytes in ``logprobs``), whole and
    streamed."""
    ref = want["chat_ids"]
    text = tokenizer.detokenize(ref)
    extra = {"ignore_eos": True}
    out = shifted.chat.completions.create(
        model="m",
        messages=prompts["chat"],
        max_tokens=M,
        temperature=0,
        logprobs=True,
        top_logprobs=0,
        extra_body=extra,
    )
    choice = out.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert [bytes(t.bytes or []) for t in choice.logprobs.content] == _pieces(tokenizer, ref)
    assert (choice.message.content, choice.finish_reason) == (text, "length")
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (N_CTX, M)
    chunks = list(
        shifted.chat.completions.create(
            model="m",
            messages=prompts["chat"],
            max_tokens=M,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (N_CTX, M)


def _refused(call: Any, n_prompt: int) -> None:
    """``call`` is a 400 naming the prompt, its length and the context."""
    with pytest.raises(openai.BadRequestError) as err:
        call()
    e = err.value
    assert (e.code, e.param) == ("context_length_exceeded", "prompt")
    assert f"the prompt has {n_prompt} tokens but the context size is {N_CTX}" in e.message


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_longer_than_the_context_is_refused_by_name(
    shifted: openai.OpenAI, prompts: dict[str, Any], stream: bool
) -> None:
    """A shift makes room for generated tokens, not for a longer prompt:
    one token past the context is refused, as ``Engine`` refuses it, and
    the server goes on serving."""
    _refused(
        lambda: shifted.completions.create(
            model="m", prompt=prompts["long_text"], max_tokens=4, stream=stream
        ),
        N_CTX + 1,
    )
    _refused(
        lambda: shifted.chat.completions.create(
            model="m", messages=prompts["long_chat"], max_tokens=4, stream=stream
        ),
        N_CTX + 1,
    )
    out = shifted.completions.create(model="m", prompt=prompts["text"], max_tokens=1)
    assert out.usage is not None and out.usage.prompt_tokens == N_CTX


@pytest.mark.parametrize("stream", [False, True])
def test_without_the_shift_a_full_prompt_is_refused_by_name(
    unshifted: openai.OpenAI, model_path: Path, prompts: dict[str, Any], stream: bool
) -> None:
    """Without ``--context-shift`` the full prompts are 400s naming the
    limit, streamed or not; one token shorter is served, and ends with
    "length" when the context fills, as an engine without a shift."""
    _refused(
        lambda: unshifted.completions.create(
            model="m", prompt=prompts["text"], max_tokens=4, stream=stream
        ),
        N_CTX,
    )
    _refused(
        lambda: unshifted.chat.completions.create(
            model="m", messages=prompts["chat"], max_tokens=4, stream=stream
        ),
        N_CTX,
    )
    short = prompts["text_ids"][:-1]
    e = Engine(model_path, context_size=N_CTX, threads=2, sampler=SamplerConfig.greedy())
    ref = e.generate(short, 4, ignore_eos=True)
    out = unshifted.completions.create(
        model="m", prompt=short, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
    )
    assert (out.choices[0].text, out.choices[0].finish_reason) == (ref.text, "length")
    assert out.usage is not None and out.usage.completion_tokens == len(ref.tokens) == 1
