"""``tools`` / ``tool_choice`` on the server through the official
``openai`` client: auto, required and a named function, plain and
streamed, the call grammar's guarantee over sampled runs, how many calls a
reply may hold within its budget, and a tool result round-tripping through
the chat template."""

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
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}


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


@pytest.mark.parametrize("tools", ["omitted", "tool_choice none"])
def test_a_tool_history_renders_when_the_loop_asks_for_the_final_answer(
    client: openai.OpenAI, tools: str
) -> None:
    # An agent loop's last request: the history holds a call (content null,
    # as the API returned it) and its result, and the request offers no
    # tools (or tool_choice "none"). It was a 400 ("can only concatenate
    # str (not NoneType)").
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
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "25 C"},
    ]
    extra: dict[str, Any] = {"tools": TOOLS, "tool_choice": "none"} if tools != "omitted" else {}
    r = client.chat.completions.create(
        model=MODEL, messages=history, temperature=0, max_tokens=8, **extra
    )
    assert r.choices[0].message.tool_calls is None
    assert isinstance(r.choices[0].message.content, str)
    # Both calls and both results reached the prompt.
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


def _reply(client: openai.OpenAI, stream: bool, **kw: Any) -> tuple[str | None, list[Any], int]:
    """A greedy reply to ASK: its finish_reason, its calls as (name,
    arguments) pairs, and its completion tokens (plain replies only)."""
    args = dict(model=MODEL, messages=ASK, tools=TOOLS, temperature=0, **kw)
    if not stream:
        r = client.chat.completions.create(**args)
        ch = r.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in ch.message.tool_calls or []]  # type: ignore[union-attr]
        assert r.usage is not None
        return ch.finish_reason, calls, r.usage.completion_tokens
    finish = None
    parts: dict[int, list[str]] = {}
    for chunk in client.chat.completions.create(**args, stream=True):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        for tc in ch.delta.tool_calls or []:
            assert tc.function is not None
            got = parts.setdefault(tc.index, ["", ""])
            got[0] += tc.function.name or ""
            got[1] += tc.function.arguments or ""
        finish = ch.finish_reason or finish
    return finish, [tuple(parts[i]) for i in sorted(parts)], 0


@pytest.mark.parametrize(
    ("max_tokens", "stream"),
    [(96, False), (96, True), (200, False)],
    ids=["96", "96-streamed", "200"],
)
def test_a_named_choice_is_one_call_then_the_end(
    client: openai.OpenAI, max_tokens: int, stream: bool
) -> None:
    """OpenAI's forced call: exactly one, whatever the budget leaves (the
    parallel grammar used to let a second one follow, squeezed into the
    budget and ending 'length' at 96, whole and repeated at 200)."""
    finish, calls, _ = _reply(client, stream, tool_choice=NAMED, max_tokens=max_tokens)
    assert finish == "tool_calls" and len(calls) == 1, (finish, calls)
    assert calls[0][0] == "get_weather"
    jsonschema.validate(json.loads(calls[0][1]), WEATHER)


def test_parallel_tool_calls_false_is_at_most_one_call(client: openai.OpenAI) -> None:
    for choice in ("required", NAMED):
        finish, calls, _ = _reply(client, False, tool_choice=choice, parallel_tool_calls=False)
        assert finish == "tool_calls" and len(calls) == 1, (choice, finish, calls)


def test_another_parallel_call_begins_only_when_the_budget_can_close_it(
    client: openai.OpenAI,
) -> None:
    """With parallel calls allowed, a budget that holds one call but not two
    ends the turn after the first, with 'tool_calls' (before: a second call
    was begun and cut to its shortest valid form, or the budget's forced
    end said 'length'); one that ends exactly with a call is no cut either;
    and where there is room, every call the reply holds is whole."""
    _, (one,), n1 = _reply(client, False, tool_choice="required", parallel_tool_calls=False)
    for max_tokens, stream in ((n1, False), (2 * n1 - 3, False), (2 * n1 - 3, True)):
        finish, calls, _ = _reply(client, stream, tool_choice="required", max_tokens=max_tokens)
        assert (finish, calls) == ("tool_calls", [one]), (max_tokens, stream, finish, calls)
    finish, calls, _ = _reply(client, False, tool_choice="required", max_tokens=3 * n1)
    assert finish == "tool_calls" and calls[0] == one, (finish, calls)
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
