"""``n``, ``logprobs`` / ``top_logprobs`` and the frequency and presence
penalties through the official ``openai`` client: OpenAI's shapes, plain
and streamed, checked against a lone engine."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from oxillama import AsyncEngine, Engine, SamplerConfig
from tests._serve import serving

MODEL = "smollm2"
PROMPT = "List three fruits:"


@pytest.fixture(scope="module")
def client(model_path: Path) -> Iterator[openai.OpenAI]:
    engine = AsyncEngine(model_path, context_size=256, threads=2, max_batch=8)
    with serving(engine, MODEL) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_n_greedy_choices_are_identical_and_usage_counts_them_all(
    client: openai.OpenAI, engine: Engine
) -> None:
    c = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, n=3)
    assert [ch.index for ch in c.choices] == [0, 1, 2]
    want = engine.generate(PROMPT, 8)
    assert {ch.text for ch in c.choices} == {want.text}
    assert c.usage is not None and c.usage.completion_tokens == 3 * len(want.tokens)


def test_n_sampled_chat_choices_differ_and_repeat_with_the_seed(client: openai.OpenAI) -> None:
    def ask() -> list[str]:
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Name an animal."}],
            max_tokens=10,
            temperature=1.2,
            seed=7,
            n=4,
        )
        return [ch.message.content or "" for ch in r.choices]

    first = ask()
    assert len(first) == 4 and len(set(first)) > 1
    assert ask() == first


def test_completion_logprobs_in_the_legacy_shape(client: openai.OpenAI, engine: Engine) -> None:
    c = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3
    )
    want = engine.generate(PROMPT, 6, logprobs=3)
    assert want.logprobs is not None
    lp = c.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.tokens == [t.text for t in want.logprobs]
    assert all(
        math.isclose(a, b.logprob, abs_tol=1e-3)
        for a, b in zip(lp.token_logprobs, want.logprobs, strict=True)
    )
    assert lp.top_logprobs is not None and all(len(d) <= 3 for d in lp.top_logprobs)
    assert lp.text_offset is not None and lp.text_offset[0] == 0
    assert lp.text_offset == sorted(lp.text_offset)


def test_chat_logprobs_plain_and_streamed(client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "Say hi."}]
    r = client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) >= 1
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 2
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert bytes(e.bytes or []).decode("utf-8", errors="replace") == e.token
        assert e.token == e.top_logprobs[0].token  # greedy: the most likely token
    streamed = []
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=msgs,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        stream=True,
    ):
        ch = chunk.choices[0]
        if ch.logprobs is not None and ch.logprobs.content:
            streamed += [(e.token, round(e.logprob, 3)) for e in ch.logprobs.content]
    assert streamed == [(e.token, round(e.logprob, 3)) for e in content]


def test_streamed_n_choices_arrive_with_their_index(client: openai.OpenAI) -> None:
    texts = ["", "", ""]
    finished = set()
    usage = None
    for chunk in client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        n=3,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            texts[ch.index] += ch.text
            if ch.finish_reason is not None:
                finished.add(ch.index)
    assert finished == {0, 1, 2} and texts[0] == texts[1] == texts[2] and texts[0]
    assert usage is not None and usage.completion_tokens >= 3


def test_penalties_match_a_lone_engine(client: openai.OpenAI, engine: Engine) -> None:
    prompt = "one one one one one one"
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    pen = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=8,
        temperature=0,
        presence_penalty=2.0,
        frequency_penalty=1.0,
    )
    cfg = SamplerConfig(temperature=0.0, presence_penalty=2.0, frequency_penalty=1.0)
    assert pen.choices[0].text == engine.generate(prompt, 8, sampler=cfg).text
    assert pen.choices[0].text != plain.choices[0].text
