"""A thinking model's ``<think>...</think>`` kept apart from its answer:
the splitter piece by piece, ``Engine.chat``, and the chat endpoint under
each ``--reasoning-format``, streamed and not. SmolLM2 is no thinking
model: a grammar makes it write the reasoning markers."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from oxillama import AsyncEngine, Engine, SamplerConfig
from oxillama.decoding.reasoning import ReasoningSplitter, split_reasoning, thinks
from oxillama.errors import ParameterError
from oxillama.serving.http import build_app

REASONING, ANSWER = "The capital is Paris.", "Paris"
REPLY = f"<think>\n{REASONING}</think>\n\n{ANSWER}"
GRAMMAR = 'root ::= "' + REPLY.replace("\n", "\\n") + '"'
ASK = [{"role": "user", "content": "What is the capital of France?"}]


def _pieces(text: str, cuts: list[int], *, inside: bool = False) -> tuple[str, str]:
    s = ReasoningSplitter(inside=inside)
    bounds = [0, *sorted(set(c % (len(text) + 1) for c in cuts)), len(text)]
    parts = [s.feed(text[a:b]) for a, b in itertools.pairwise(bounds)]
    parts.append(s.finish())
    return "".join(r for r, _ in parts), "".join(a for _, a in parts)


@given(st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_any_cut_of_the_stream_gives_the_whole_split(cuts: list[int]) -> None:
    for text, inside in [
        (REPLY, False),
        ("  <think>a</thi", False),
        ("no markers here </think>", False),
        (f"{REASONING}</think>{ANSWER}", True),
        ("<thinking> is not the marker", False),
    ]:
        whole = split_reasoning(text, inside=inside)
        assert _pieces(text, cuts, inside=inside) == (whole[0] or "", whole[1])


def test_the_split_of_whole_replies() -> None:
    assert split_reasoning(REPLY) == (REASONING, ANSWER)
    assert split_reasoning("Just Paris.") == (None, "Just Paris.")
    # The template opened the reasoning: the reply starts inside it.
    assert split_reasoning(f"{REASONING}</think>\n{ANSWER}", inside=True) == (REASONING, ANSWER)
    # Cut by max_tokens before </think>: all of it is reasoning.
    assert split_reasoning("<think>still going") == ("still going", "")
    assert split_reasoning("<think></think>Paris") == ("", "Paris")


def test_thinks_reads_the_template_or_the_vocabulary() -> None:
    one_token = lambda s: [7]  # noqa: E731
    many = lambda s: [1, 2, 3]  # noqa: E731
    assert thinks("{{ '<think>\\n' }}", many)
    assert thinks(None, one_token)
    assert not thinks("{{ messages }}", many)


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[AsyncEngine]:
    e = AsyncEngine(model_path, context_size=512, threads=2, max_batch=2)
    yield e
    asyncio.run(e.close())


def _chat(c: TestClient, stream: bool) -> tuple[str | None, str]:
    body: dict[str, Any] = {"messages": ASK, "max_tokens": 48, "grammar": GRAMMAR}
    if not stream:
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        return msg.get("reasoning_content"), msg["content"]
    r = c.post("/v1/chat/completions", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    reasoning, content, saw = "", "", False
    for line in r.text.splitlines():
        if not line.startswith("data: {"):
            continue
        delta = json.loads(line[6:])["choices"][0]["delta"]
        if "reasoning_content" in delta:
            saw = True
            # Reasoning comes before any of the answer.
            assert not content
        reasoning += delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
    return (reasoning if saw else None), content


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("fmt", ["deepseek", "none", "auto"])
def test_the_chat_endpoint_under_each_format(engine: AsyncEngine, fmt: Any, stream: bool) -> None:
    with TestClient(build_app(engine, reasoning_format=fmt)) as c:
        reasoning, content = _chat(c, stream)
    if fmt == "deepseek":
        assert (reasoning, content) == (REASONING, ANSWER)
    else:
        # "none" never splits; "auto" does not for SmolLM2, which has no
        # <think> token and a template that never writes one.
        assert (reasoning, content) == (None, REPLY)


def test_engine_chat_returns_the_reasoning_apart(model_path: Path) -> None:
    e = Engine(model_path, context_size=512, threads=2, sampler=SamplerConfig.greedy())
    c = e.chat(ASK, 48, grammar=GRAMMAR, reasoning_format="deepseek")
    assert (c.reasoning, c.text) == (REASONING, ANSWER)
    e.reset()
    c = e.chat(ASK, 48, grammar=GRAMMAR)  # auto: SmolLM2 does not think
    assert (c.reasoning, c.text) == (None, REPLY)
    with pytest.raises(ParameterError, match="reasoning format"):
        e.chat(ASK, 4, reasoning_format="r1")  # type: ignore[arg-type]


def test_budget_zero_turns_thinking_off_through_the_template(engine: AsyncEngine) -> None:
    with pytest.raises(ParameterError, match="reasoning budget"):
        build_app(engine, reasoning_budget=5)
    # enable_thinking reaches the template unless the request sets it.
    with TestClient(build_app(engine, reasoning_budget=0)) as c:
        r = c.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2})
        assert r.status_code == 200, r.text
        r = c.post(
            "/v1/chat/completions",
            json={"messages": ASK, "max_tokens": 2, "chat_template_kwargs": {"x": 1}},
        )
        assert r.status_code == 200, r.text
