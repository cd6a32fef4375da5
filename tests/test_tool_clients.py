"""The structured-output clients people point at a local server, against
``oxillama serve``: ``instructor`` (tools and JSON-schema modes),
LangChain's ``ChatOpenAI`` (a forced tool, and ``with_structured_output``
through function calling and through a JSON schema) and a ``pydantic-ai``
agent with an output type, each at ``max_tokens=96`` and at the server's
default. Each gets its validated object (or its tool call), and every
response it was sent ends as OpenAI's would: ``"tool_calls"`` where a call
was forced, ``"stop"`` for a JSON-schema reply (issue 33: a forced call
used to be followed by a second one squeezed into the budget, ending in
``"length"``, which ``instructor`` rejects)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import instructor
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from oxillama import AsyncEngine
from tests._serve import serving

MODEL = "smollm2"
# Before the fix, instructor's tools mode at max_tokens=96 raised
# IncompleteOutputException on this one.
ASK = "Extract the user from: Jason is 25 years old and lives in Paris."


class User(BaseModel):
    name: str
    age: int


class Recorder:
    """The chat completion requests a client sent and the JSON bodies it
    received, read by an httpx event hook (what the client parsed)."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []
        self.bodies: list[dict[str, Any]] = []

    def _keep(self, response: httpx2.Response) -> None:
        if response.request.url.path.endswith("/chat/completions"):
            self.asked.append(json.loads(response.request.content))
            self.bodies.append(response.json())

    def hook(self, response: httpx2.Response) -> None:
        response.read()
        self._keep(response)

    async def ahook(self, response: httpx2.Response) -> None:
        await response.aread()
        self._keep(response)

    def client(self) -> httpx2.Client:
        return httpx2.Client(event_hooks={"response": [self.hook]}, timeout=120)

    def async_client(self) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(event_hooks={"response": [self.ahook]}, timeout=120)

    def finish_reasons(self) -> list[str]:
        return [c["finish_reason"] for b in self.bodies for c in b["choices"]]


@pytest.fixture(scope="module")
def base_url(model_path: Path) -> Iterator[str]:
    engine = AsyncEngine(model_path, context_size=1024, threads=2, max_batch=4)
    with serving(engine, MODEL) as url:
        yield url + "/v1"


def _openai(url: str, rec: Recorder) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, http_client=rec.client())


def _budget(max_tokens: int | None) -> dict[str, int]:
    return {} if max_tokens is None else {"max_tokens": max_tokens}


def via_instructor(mode: instructor.Mode) -> Callable[[str, Recorder, int | None], User]:
    def run(url: str, rec: Recorder, max_tokens: int | None) -> User:
        client = instructor.from_openai(_openai(url, rec), mode=mode)
        user: User = client.chat.completions.create(
            model=MODEL,
            response_model=User,
            messages=[{"role": "user", "content": ASK}],
            temperature=0,
            # One attempt: a rejected reply must fail the test, not be retried.
            max_retries=1,
            **_budget(max_tokens),
        )
        return user

    return run


def _chat(url: str, rec: Recorder, max_tokens: int | None) -> ChatOpenAI:
    return ChatOpenAI(
        model=MODEL,
        base_url=url,
        api_key="unused",  # type: ignore[arg-type]
        temperature=0,
        max_retries=0,
        http_client=rec.client(),
        **_budget(max_tokens),  # type: ignore[arg-type]
    )


def lc_bind_tools(url: str, rec: Recorder, max_tokens: int | None) -> User:
    msg = _chat(url, rec, max_tokens).bind_tools([User], tool_choice="User").invoke(ASK)
    calls = msg.tool_calls  # type: ignore[attr-defined]
    assert [c["name"] for c in calls] == ["User"], msg
    return User.model_validate(calls[0]["args"])


def lc_structured(method: str) -> Callable[[str, Recorder, int | None], User]:
    def run(url: str, rec: Recorder, max_tokens: int | None) -> User:
        chat = _chat(url, rec, max_tokens)
        out = chat.with_structured_output(User, method=method, include_raw=True).invoke(ASK)  # type: ignore[arg-type]
        assert isinstance(out, dict) and out["parsing_error"] is None, out
        parsed = out["parsed"]
        assert isinstance(parsed, User)
        return parsed

    return run


def pydantic_ai_agent(url: str, rec: Recorder, max_tokens: int | None) -> User:
    # A fresh async client per run: run_sync may run each call on its own
    # event loop, and a pooled connection belongs to the loop that made it.
    client = openai.AsyncOpenAI(
        base_url=url, api_key="unused", max_retries=0, http_client=rec.async_client()
    )
    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, output_type=User)
    settings: dict[str, Any] = {"temperature": 0, **_budget(max_tokens)}
    try:
        result = agent.run_sync(ASK, model_settings=settings)  # type: ignore[arg-type]
    finally:
        asyncio.run(client.close())
    return result.output


#: Each client, how it is asked, and the finish its responses must carry.
CLIENTS: dict[str, tuple[Callable[[str, Recorder, int | None], User], str]] = {
    "instructor-tools": (via_instructor(instructor.Mode.TOOLS), "tool_calls"),
    "instructor-json-schema": (via_instructor(instructor.Mode.JSON_SCHEMA), "stop"),
    "langchain-bind-tools": (lc_bind_tools, "tool_calls"),
    "langchain-function-calling": (lc_structured("function_calling"), "tool_calls"),
    "langchain-json-schema": (lc_structured("json_schema"), "stop"),
    "pydantic-ai-tool-output": (pydantic_ai_agent, "tool_calls"),
}


@pytest.mark.parametrize("max_tokens", [96, None], ids=["max_tokens=96", "default"])
@pytest.mark.parametrize("name", list(CLIENTS))
def test_client_gets_its_object_and_openai_finish_reasons(
    base_url: str, name: str, max_tokens: int | None
) -> None:
    run, finish = CLIENTS[name]
    rec = Recorder()
    user = run(base_url, rec, max_tokens)
    assert isinstance(user, User), user
    # Printed for the record (pytest -s): what each response said.
    print(f"{name} max_tokens={max_tokens}: finish_reason {rec.finish_reasons()}")
    assert rec.finish_reasons() == [finish], json.dumps(rec.bodies)[:2000]
    if finish == "tool_calls":
        calls = rec.bodies[0]["choices"][0]["message"]["tool_calls"]
        if isinstance(rec.asked[0]["tool_choice"], dict):
            # A named function: one call, then the end of the turn.
            assert len(calls) == 1, calls
        for call in calls:
            User.model_validate_json(call["function"]["arguments"])
