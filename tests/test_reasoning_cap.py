"""A cap on a reply's ``<think>`` reasoning (``reasoning_budget=`` on the
chats of ``Engine``, ``AsyncEngine`` and ``AsyncSession``, Anthropic's
``thinking.budget_tokens``): at the cap, inside
the reasoning, ``"\\n</think>\\n\\n"`` is forced and the reply goes on to
its answer. SmolLM2 under a template that opens ``<think>`` for it (as
DeepSeek-R1's does) reasons on and on without closing it, so the cap is
what ends the reasoning."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from oxillama import AsyncEngine, Completion, Engine, SamplerConfig
from oxillama.decoding.reasoning import ReasoningCap
from oxillama.decoding.reasoning.cap import CLOSE
from oxillama.errors import ParameterError
from oxillama.serving.http import build_app
from tests.models._rewrite import rewrite
from tests.reference.family_chats import template_source

# ChatML, the assistant's turn opened inside its reasoning.
OPENS_THINKING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
ASK = [{"role": "user", "content": "Why is the sky blue? Think it through."}]


def _tok(text: str) -> list[int]:
    # A vocabulary where every character is a token.
    return [ord(c) for c in text]


def test_the_close_is_due_at_the_cap_inside_the_reasoning_only() -> None:
    cap = ReasoningCap.of(3, _tok, inside=True)
    assert cap.close == tuple(_tok(CLOSE))
    assert cap.due(3, "abc") == cap.close
    assert cap.due(2, "ab") == () and cap.due(4, "abcd") == ()
    assert cap.due(3, "a</think>b") == ()  # closed in time
    outside = ReasoningCap.of(3, _tok, inside=False)
    assert outside.due(3, "abc") == ()  # no reasoning: all answer
    assert outside.due(3, " <think>a") == outside.close
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ParameterError, match="reasoning_budget"):
            ReasoningCap.of(bad, _tok, inside=True)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def think_path(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("cap") / "smollm2-opens-think.gguf"
    rewrite(model_path, dst, strings={"tokenizer.chat_template": OPENS_THINKING})
    return dst


@pytest.fixture(scope="module")
def engine(think_path: Path) -> Iterator[AsyncEngine]:
    e = AsyncEngine(
        think_path, context_size=2048, threads=2, max_batch=4, sampler=SamplerConfig.greedy()
    )
    yield e
    asyncio.run(e.close())


def _close(e: AsyncEngine) -> list[int]:
    return e.engine.tokenize(CLOSE, add_special=False, parse_special=True)


async def _capped_four_ways(e: AsyncEngine, budget: int, n: int) -> list[Completion]:
    """The capped reply through the four async chats at once, beside a
    plain request in flight."""
    session, other = e.session(), e.session()

    async def streamed(open_stream: Any) -> Completion:
        result: list[Completion] = []
        async for _ in open_stream(result):
            pass
        return result[0]

    try:
        busy, *outs = await asyncio.gather(
            e.generate("Once upon a time", 30, ignore_eos=True),
            e.chat(ASK, n, reasoning_budget=budget),
            streamed(lambda r: e.chat_stream(ASK, n, reasoning_budget=budget, result=r)),
            session.chat(ASK, n, reasoning_budget=budget),
            streamed(lambda r: other.chat_stream(ASK, n, reasoning_budget=budget, result=r)),
        )
    finally:
        await session.close()
        await other.close()
    assert len(busy.tokens) == 30
    return outs


def test_the_cap_closes_the_reasoning_and_the_answer_follows(engine: AsyncEngine) -> None:
    budget, n = 8, 40
    close = _close(engine)
    free = asyncio.run(engine.chat(ASK, n))
    # Uncapped, the reasoning runs past the cap and never closes.
    assert free.text == "" and free.reasoning is not None and len(free.tokens) == n
    outs = asyncio.run(_capped_four_ways(engine, budget, n))
    # The synchronous engine caps it the same way, whole and streamed.
    sync = Engine(engine.model, context_size=2048, threads=2, sampler=SamplerConfig.greedy())
    outs.append(sync.chat(ASK, n, reasoning_budget=budget))
    sync.reset()
    result: list[Completion] = []
    assert "".join(sync.chat_stream(ASK, n, reasoning_budget=budget, result=result))
    outs += result
    for c in outs:
        # The same first tokens as uncapped, then the close, then the answer.
        assert c.tokens[:budget] == free.tokens[:budget]
        assert c.tokens[budget : budget + len(close)] == close
        assert len(c.tokens) == n and c.finish_reason == "length"
        head = engine.engine.detokenize(c.tokens[:budget])
        assert c.reasoning == (head + "\n").lstrip()
        assert c.text and c.text == outs[0].text


def test_a_reply_that_never_reasons_is_left_alone(model_path: Path) -> None:
    # Qwen3's template does not open the reasoning, and SmolLM2 never does.
    async def run() -> tuple[Completion, Completion]:
        e = AsyncEngine(model_path, context_size=512, threads=2, sampler=SamplerConfig.greedy())
        try:
            return (
                await e.chat(ASK, 16, reasoning_budget=4, reasoning_format="deepseek"),
                await e.chat(ASK, 16, reasoning_format="deepseek"),
            )
        finally:
            await e.close()

    capped, free = asyncio.run(run())
    assert capped.tokens == free.tokens and capped.reasoning is None


def test_harmony_refuses_a_reasoning_budget(tmp_path: Path) -> None:
    src = Path(__file__).parent / "models" / "fixtures" / "gpt-oss.gguf"
    dst = tmp_path / "gpt-oss-chat.gguf"
    rewrite(src, dst, strings={"tokenizer.chat_template": template_source("openai-gpt-oss-120b")})
    e = AsyncEngine(dst, context_size=512, threads=2)
    try:
        with pytest.raises(ParameterError, match="harmony"):
            asyncio.run(e.chat(ASK, 4, reasoning_budget=16))
    finally:
        asyncio.run(e.close())


def _messages(c: TestClient, body: dict[str, Any]) -> tuple[str, str, str, int]:
    """The thinking, the text, the stop reason and the output tokens of a
    Messages request, whole or streamed."""
    r = c.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    if not body.get("stream"):
        m = r.json()
        assert [b["type"] for b in m["content"]] == ["thinking", "text"]
        thinking, text = m["content"][0]["thinking"], m["content"][1]["text"]
        return thinking, text, m["stop_reason"], m["usage"]["output_tokens"]
    thinking, text, reason, used = "", "", "", -1
    for line in r.text.splitlines():
        if not line.startswith("data: "):
            continue
        e = json.loads(line[6:])
        if e["type"] == "content_block_delta":
            thinking += e["delta"].get("thinking", "")
            text += e["delta"].get("text", "")
        elif e["type"] == "message_delta":
            reason, used = e["delta"]["stop_reason"], e["usage"]["output_tokens"]
    return thinking, text, reason, used


def test_messages_budget_tokens_caps_the_thinking_block(engine: AsyncEngine) -> None:
    budget, n = 1024, 1032  # Anthropic's least budget, below max_tokens
    body: dict[str, Any] = {
        "model": "oxillama",
        "max_tokens": n,
        "temperature": 0,
        "messages": ASK,
        "thinking": {"type": "enabled", "budget_tokens": budget},
    }
    with (
        TestClient(build_app(engine, reasoning_format="deepseek")) as c,
        ThreadPoolExecutor(3) as pool,
    ):
        # The three are decoded in the same batched steps.
        want_f = pool.submit(asyncio.run, engine.chat(ASK, n, reasoning_budget=budget))
        got_f = [pool.submit(_messages, c, {**body, "stream": s}) for s in (False, True)]
        want = want_f.result()
        got = [f.result() for f in got_f]
    assert want.tokens[budget : budget + len(_close(engine))] == _close(engine)
    assert got == [(want.reasoning, want.text, "max_tokens", n)] * 2
