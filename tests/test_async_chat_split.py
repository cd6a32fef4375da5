"""``AsyncEngine.chat`` and ``AsyncSession.chat``, whole and streamed, give
the reply apart exactly as ``Engine.chat`` does, with other requests in
flight: a gpt-oss harmony reply (the gpt-oss fixture under gpt-oss's own
template) split by channel into reasoning, content and tool calls, and a
``<think>`` reply (SmolLM2 under Qwen3's template, which writes the
markers) split into reasoning and answer. Random weights and SmolLM2 write
neither format by themselves: a grammar forces each reply."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oxillama import AsyncEngine, Completion, Engine, SamplerConfig
from oxillama.decoding.completion import Timings
from oxillama.decoding.reasoning import ReplySplit
from oxillama.errors import ParameterError
from tests.models._rewrite import rewrite
from tests.reference.family_chats import TOOLS, template_source

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

ANALYSIS = "<|channel|>analysis<|message|>Paris weather: call the tool.<|end|>"
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}'
)
FINAL = "<|start|>assistant<|channel|>final<|message|>It is 21 °C."
THINK = "<think>\nIt is warm in June.</think>\n\nAbout 21 °C."


def _forced(text: str) -> str:
    return "root ::= " + json.dumps(text)


def _apart(c: Completion) -> tuple[str, str | None, list[tuple[str, Any]]]:
    return c.text, c.reasoning, [(t.name, t.arguments) for t in c.tool_calls]


def _with_template(src: Path, dst: Path, template: str) -> Path:
    rewrite(src, dst, strings={"tokenizer.chat_template": template})
    return dst


@pytest.fixture(scope="module")
def harmony_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = Path(__file__).parent / "models" / "fixtures" / "gpt-oss.gguf"
    dst = tmp_path_factory.mktemp("harmony") / "gpt-oss-chat.gguf"
    return _with_template(src, dst, template_source("openai-gpt-oss-120b"))


@pytest.fixture(scope="module")
def think_path(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("think") / "smollm2-qwen3-template.gguf"
    return _with_template(model_path, dst, template_source("qwen3-0.6b"))


def _async(path: Path) -> Iterator[AsyncEngine]:
    e = AsyncEngine(path, context_size=1024, threads=2, max_batch=4, sampler=SamplerConfig.greedy())
    yield e
    asyncio.run(e.close())


@pytest.fixture(scope="module")
def harmony_async(harmony_path: Path) -> Iterator[AsyncEngine]:
    yield from _async(harmony_path)


@pytest.fixture(scope="module")
def think_async(think_path: Path) -> Iterator[AsyncEngine]:
    yield from _async(think_path)


async def _every_async_form(e: AsyncEngine, reply: str, busy: str, **kw: Any) -> list[Completion]:
    """The reply through the four async chat forms, all at once beside a
    plain request that keeps the batch busy."""
    grammar = _forced(reply)
    session = e.session()

    async def streamed(pieces_of: Any) -> Completion:
        result: list[Completion] = []
        pieces = [p async for p in pieces_of(result)]
        # The pieces are the reply as written; the result is split.
        assert "".join(pieces) == reply
        assert len(result) == 1
        return result[0]

    other_session = e.session()
    try:
        outs = await asyncio.gather(
            e.generate(busy, 40, ignore_eos=True),
            e.chat(ASK, 300, grammar=grammar, **kw),
            streamed(lambda r: e.chat_stream(ASK, 300, grammar=grammar, result=r, **kw)),
            session.chat(ASK, 300, grammar=grammar, **kw),
            streamed(
                lambda r: other_session.chat_stream(ASK, 300, grammar=grammar, result=r, **kw)
            ),
        )
    finally:
        await session.close()
        await other_session.close()
    busy_out, *chats = outs
    assert len(busy_out.tokens) == 40
    return chats


def _engine_chat(e: AsyncEngine, reply: str, **kw: Any) -> Completion:
    sync = Engine(e.model, context_size=1024, threads=2, sampler=SamplerConfig.greedy())
    return sync.chat(ASK, 300, grammar=_forced(reply), **kw)


def test_harmony_tool_call_comes_apart_in_every_async_chat(harmony_async: AsyncEngine) -> None:
    reply = ANALYSIS + CALL
    want = _engine_chat(harmony_async, reply, tools=TOOLS)
    assert _apart(want) == (
        "",
        "Paris weather: call the tool.",
        [("get_weather", {"city": "Paris"})],
    )
    chats = asyncio.run(_every_async_form(harmony_async, reply, "Once upon a time", tools=TOOLS))
    for got in chats:
        assert _apart(got) == _apart(want)
        assert got.tokens == want.tokens


def test_harmony_answer_and_none_format_in_every_async_chat(harmony_async: AsyncEngine) -> None:
    reply = ANALYSIS + FINAL
    want = _engine_chat(harmony_async, reply)
    assert _apart(want) == ("It is 21 °C.", "Paris weather: call the tool.", [])
    for got in asyncio.run(_every_async_form(harmony_async, reply, "The sea")):
        assert _apart(got) == _apart(want)
    # "none": the reply as the model wrote it, as Engine.chat gives it.
    raw = asyncio.run(_every_async_form(harmony_async, reply, "A", reasoning_format="none"))
    assert [_apart(c) for c in raw] == [(reply, None, [])] * 4


def test_think_reply_comes_apart_in_every_async_chat(think_async: AsyncEngine) -> None:
    want = _engine_chat(think_async, THINK)
    assert _apart(want) == ("About 21 °C.", "It is warm in June.", [])
    for got in asyncio.run(_every_async_form(think_async, THINK, "The weather in Paris")):
        assert _apart(got) == _apart(want)
        assert got.tokens == want.tokens


def test_an_unknown_reasoning_format_is_refused_by_name(think_async: AsyncEngine) -> None:
    with pytest.raises(ParameterError, match="reasoning format"):
        asyncio.run(think_async.chat(ASK, 4, reasoning_format="r1"))  # type: ignore[arg-type]

    async def first_piece() -> None:
        stream = think_async.chat_stream(ASK, 4, reasoning_format="r1")  # type: ignore[arg-type]
        await anext(stream)

    with pytest.raises(ParameterError, match="reasoning format"):
        asyncio.run(first_piece())


def test_reply_split_follows_format_template_and_prompt() -> None:
    def many(text: str) -> list[int]:
        return [1, 2]

    harmony = template_source("openai-gpt-oss-120b")
    assert ReplySplit.choose("auto", harmony, many, "x") == ReplySplit("harmony")
    assert ReplySplit.choose("none", harmony, many, "x") == ReplySplit("none")
    assert ReplySplit.choose("auto", "{{ messages }}", many, "x") == ReplySplit("none")
    assert ReplySplit.choose("deepseek", "{{ messages }}", many, "a <think>\n") == ReplySplit(
        "think", inside=True
    )
    split = ReplySplit.choose("auto", "{{ '<think>' }}", many, "a <think>\n")
    done = Completion("warm</think>\n\nhot", [], "stop", Timings(0, 0.0, 0, 0.0))
    assert _apart(split.apply(done)) == ("hot", "warm", [])
