"""``tools`` / ``tool_choice`` on the server through the official
``openai`` client: auto, required and a named function, plain and
streamed, the call grammar's guarantee over sampled runs, and a tool
result round-tripping through the chat template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from oxillama import AsyncEngine
from tests._serve import serving

MODEL = "smollm2"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"],
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": WEATHER,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK: list[Any] = [{"role": "user", "content": "What's the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(model_path: Path) -> Iterator[openai.OpenAI]:
    engine = AsyncEngine(model_path, context_size=1024, threads=2, max_batch=10)
    with serving(engine, MODEL) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_auto_without_a_call_is_plain_content(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, temperature=0, max_tokens=16
    )
    msg = r.choices[0].message
    assert msg.content and not msg.tool_calls
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_a_required_call_is_returned_as_tool_calls(client: openai.OpenAI, choice: Any) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice=choice,
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=80,
    )
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    calls = ch.message.tool_calls or []
    assert len(calls) == 1 and calls[0].type == "function" and calls[0].id.startswith("call_")
    fn = calls[0].function  # type: ignore[union-attr]
    if isinstance(choice, dict):
        assert fn.name == "get_weather"
    jsonschema.validate(json.loads(fn.arguments), SCHEMAS[fn.name])


def test_streamed_calls_arrive_as_tool_call_deltas(client: openai.OpenAI) -> None:
    args: dict[int, str] = {}
    names: dict[int, str] = {}
    finish = None
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=80,
        stream=True,
    ):
        ch = chunk.choices[0]
        assert not ch.delta.content  # the call's text never leaks as content
        for tc in ch.delta.tool_calls or []:
            assert tc.function is not None
            names[tc.index] = names.get(tc.index, "") + (tc.function.name or "")
            args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
        finish = ch.finish_reason or finish
    assert finish == "tool_calls" and list(names) == [0]
    plain = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=80,
    )
    call = (plain.choices[0].message.tool_calls or [])[0]
    assert names[0] == call.function.name  # type: ignore[union-attr]
    assert json.loads(args[0]) == json.loads(call.function.arguments)  # type: ignore[union-attr]


def test_required_arguments_always_validate_over_20_sampled_runs(client: openai.OpenAI) -> None:
    checked = 0
    for seed in (1, 2):
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Add 2 and 40, then check Oslo's weather."}],
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
            n=10,
            max_tokens=80,
        )
        for ch in r.choices:
            assert ch.finish_reason == "tool_calls", ch.message
            for call in ch.message.tool_calls or []:
                fn = call.function  # type: ignore[union-attr]
                jsonschema.validate(json.loads(fn.arguments), SCHEMAS[fn.name])
                checked += 1
    assert checked == 20


def test_a_tool_result_round_trips_through_the_template(client: openai.OpenAI) -> None:
    history: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
    ]
    r = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, temperature=0, max_tokens=24
    )
    assert r.choices[0].message.content
    # The tools and the result were rendered.
    assert r.usage is not None and r.usage.prompt_tokens > 60


def test_strict_tools_under_auto_are_constrained_lazily(client: openai.OpenAI) -> None:
    """A strict tool with tool_choice 'auto': the reply may be text, and a
    call, once its marker is written, runs under the schema's grammar; over
    sampled runs every call found validates."""
    strict = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]
    r = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=strict,
        temperature=1.0,
        seed=3,
        n=8,
        max_tokens=60,
    )
    for ch in r.choices:
        for call in ch.message.tool_calls or []:
            fn = call.function  # type: ignore[union-attr]
            jsonschema.validate(json.loads(fn.arguments), SCHEMAS[fn.name])
        assert ch.message.content or ch.message.tool_calls
