"""``/v1/responses`` through the official ``openai`` client: create and
stream (every event checked against the SDK's own event models, in
order), function calls and their outputs, ``previous_response_id`` (the
same greedy output as sending the whole history, with the stored history
restored rather than evaluated), ``text.format``, GET and DELETE, stored
responses under ``--max-sessions``, and the errors naming what is not
served."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pydantic
import pytest
from openai.types.responses import ResponseStreamEvent

from oxillama import AsyncEngine, SamplerConfig
from oxillama.errors import ParameterError
from oxillama.serving.http import Limits
from tests._serve import serving

MODEL = "smollm2"
GREEDY: dict[str, Any] = {"model": MODEL, "temperature": 0}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def url(model_path: Path) -> Iterator[str]:
    engine = AsyncEngine(model_path, context_size=2048, threads=2, max_batch=4)
    with serving(engine, MODEL) as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_create_answers_a_message_with_usage(client: openai.OpenAI) -> None:
    r = client.responses.create(
        input="What is the capital of France?", max_output_tokens=40, **GREEDY
    )
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete")
    [msg] = r.output
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.content[0].type == "output_text"
    assert r.output_text.strip()
    u = r.usage
    assert u is not None and u.output_tokens > 0
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens == 0
    assert u.output_tokens_details.reasoning_tokens == 0


def test_stream_events_come_in_order_and_match_the_sdk(client: openai.OpenAI, url: str) -> None:
    ask = {"input": "Say hello to Ada.", "max_output_tokens": 60, **GREEDY}
    with httpx.stream("POST", url + "/v1/responses", json={**ask, "stream": True}) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    events = [EVENTS.validate_python(json.loads(ln[6:])) for ln in lines]
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    end = "response.completed" if kinds[-1] == "response.completed" else "response.incomplete"
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        end,
    ]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-3].part.text == text
    # The SDK's own stream helper reads the same events to the same reply.
    with client.responses.stream(**ask) as s:
        got = [e.type for e in s]
        final = s.get_final_response()
    assert got == kinds and final.output_text == text
    assert client.responses.retrieve(final.id).output_text == text
    plain = client.responses.create(**ask)
    assert plain.output_text == text


def test_a_function_call_then_its_output_is_answered(client: openai.OpenAI) -> None:
    r = client.responses.create(
        input="What's the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=60,
        **GREEDY,
    )
    [call] = r.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id and call.id and call.status == "completed"
    assert "city" in json.loads(call.arguments)
    out = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"}
    ask = {"tools": [WEATHER_TOOL], "max_output_tokens": 40, **GREEDY}
    chained = client.responses.create(input=[out], previous_response_id=r.id, **ask)
    assert chained.output[0].type == "message" and chained.output_text.strip()
    # The same turn with the whole history sent back gives the same reply.
    history = [{"role": "user", "content": "What's the weather in Paris?"}, call.model_dump(), out]
    whole = client.responses.create(input=history, store=False, **ask)
    assert whole.output_text == chained.output_text
    assert chained.usage is not None and whole.usage is not None
    assert chained.usage.input_tokens == whole.usage.input_tokens
    assert chained.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens  # type: ignore[union-attr]


def test_a_streamed_function_call_sends_its_arguments(client: openai.OpenAI) -> None:
    with client.responses.stream(
        input="What's the weather in Rome?",
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60,
        **GREEDY,
    ) as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.function_call_arguments.delta" in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    [call] = final.output
    assert call.type == "function_call" and done.arguments == call.arguments
    assert json.loads(call.arguments)["city"]


def test_previous_response_id_restores_instead_of_prefilling(client: openai.OpenAI) -> None:
    ask = {"instructions": "Answer in one short sentence.", "max_output_tokens": 30, **GREEDY}
    first = client.responses.create(input="Name a fruit that is red.", **ask)
    second = client.responses.create(
        input="And one that is yellow?", previous_response_id=first.id, **ask
    )
    assert second.previous_response_id == first.id
    history = [
        {"role": "user", "content": "Name a fruit that is red."},
        *[item.model_dump() for item in first.output],
        {"role": "user", "content": "And one that is yellow?"},
    ]
    whole = client.responses.create(input=history, store=False, **ask)
    assert second.output_text == whole.output_text
    assert first.usage is not None and second.usage is not None and whole.usage is not None
    assert second.usage.input_tokens == whole.usage.input_tokens
    # The stored history is restored, not evaluated: the first input and its
    # reply (which tokenizes back to the ids it was generated as; at most
    # the closing token's KV may be missing, a reply never writes it).
    stored = second.usage.input_tokens_details.cached_tokens
    history_len = first.usage.input_tokens + first.usage.output_tokens
    assert history_len - 1 <= stored <= history_len
    assert whole.usage.input_tokens_details.cached_tokens == 0
    # The first response is still there to branch from: the same turn again
    # gives the same reply from the same restored history.
    again = client.responses.create(
        input="And one that is yellow?", previous_response_id=first.id, **ask
    )
    assert again.output_text == second.output_text
    assert again.usage is not None
    assert again.usage.input_tokens_details.cached_tokens == stored
    # Unstored, the continuation runs on a copy that does not outlive it.
    unstored = client.responses.create(
        input="And one that is yellow?", previous_response_id=first.id, store=False, **ask
    )
    assert unstored.output_text == second.output_text
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    live = httpx.get(str(client.base_url).removesuffix("/v1/") + "/v1/sessions").json()["data"]
    assert not [s for s in live if s["id"].startswith("resp_tmp")]


def test_text_format_json_schema_output_validates(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    r = client.responses.create(
        input="Invent a person.",
        text={
            "format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}
        },
        max_output_tokens=80,
        **GREEDY,
    )
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text is not None and r.text.format is not None
    assert r.text.format.type == "json_schema"


def test_get_and_delete_a_stored_response(client: openai.OpenAI, url: str) -> None:
    r = client.responses.create(input="Hi!", max_output_tokens=8, metadata={"k": "v"}, **GREEDY)
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    assert got.metadata == {"k": "v"}
    assert r.id in {s["id"] for s in httpx.get(url + "/v1/sessions").json()["data"]}
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(input="Again", previous_response_id=r.id, **GREEDY)
    assert r.id not in {s["id"] for s in httpx.get(url + "/v1/sessions").json()["data"]}


def test_an_unstored_response_is_not_kept(client: openai.OpenAI) -> None:
    r = client.responses.create(input="Hi!", max_output_tokens=4, store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"tools": [{"type": "web_search"}]}, "'web_search'"),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "http://x/y.png"}],
                    }
                ]
            },
            "'input_image'",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "'item_reference'"),
        ({"background": True}, "'background'"),
        ({"include": ["reasoning.encrypted_content"]}, "'include'"),
        ({"tool_choice": {"type": "web_search_preview"}}, "web_search_preview"),
        ({"text": {"format": {"type": "grammar"}}}, "'grammar'"),
        ({"input": [{"role": "critic", "content": "x"}]}, "'critic'"),
        ({"truncation": "auto"}, "'truncation'"),
    ],
)
def test_what_is_not_served_is_refused_by_name(url: str, body: dict[str, Any], named: str) -> None:
    r = httpx.post(url + "/v1/responses", json={"input": "Hi", "model": MODEL, **body})
    assert r.status_code == 400, r.text
    assert named in r.json()["error"]["message"]


def test_an_unknown_previous_response_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="resp_nothere"):
        client.responses.create(input="x", previous_response_id="resp_nothere", **GREEDY)


def test_stored_responses_obey_max_sessions(model_path: Path, tmp_path: Path) -> None:
    """Past --max-sessions a stored response leaves like any session:
    evicted without a sessions folder (a 404 saying why), hibernated to
    the folder with one (and continued from there, its KV restored)."""
    engine = AsyncEngine(model_path, context_size=512, threads=2, max_batch=2)
    with serving(engine, MODEL, limits=Limits(max_sessions=1)) as base:
        c = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        a = c.responses.create(input="One", max_output_tokens=4, **GREEDY)
        c.responses.create(input="Two", max_output_tokens=4, **GREEDY)
        with pytest.raises(openai.NotFoundError, match="evicted"):
            c.responses.retrieve(a.id)
        with pytest.raises(openai.NotFoundError, match="evicted"):
            c.responses.create(input="Three", previous_response_id=a.id, **GREEDY)
    engine = AsyncEngine(model_path, context_size=512, threads=2, max_batch=2)
    folder = tmp_path / "sessions"
    with serving(engine, MODEL, sessions_dir=folder, limits=Limits(max_sessions=1)) as base:
        c = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        a = c.responses.create(input="One", max_output_tokens=4, **GREEDY)
        c.responses.create(input="Two", max_output_tokens=4, **GREEDY)
        assert (folder / f"{a.id}.oxisnap").is_file()
        assert c.responses.retrieve(a.id).id == a.id
        b = c.responses.create(
            input="Three", previous_response_id=a.id, max_output_tokens=4, **GREEDY
        )
        assert a.usage is not None and b.usage is not None
        assert b.usage.input_tokens_details.cached_tokens >= a.usage.input_tokens


def test_a_call_the_template_renders_otherwise_still_continues_exactly(
    client: openai.OpenAI,
) -> None:
    """The model writes this call's arguments over several lines; the
    history renders them on one, so the stored tokens and the new prompt
    part where the call starts. The continuation still gives the whole
    history's reply, token for token."""
    ask: dict[str, Any] = {
        "instructions": "You are a travel assistant. Use get_weather to look up the weather, "
        "then answer the traveller in two sentences with advice on what to wear.",
        "tools": [
            {**WEATHER_TOOL, "description": "The current weather in a city: sky, temperature, wind"}
        ],
        "max_output_tokens": 48,
        **GREEDY,
    }
    user = {"role": "user", "content": "I am flying to Paris tomorrow. What should I pack?"}
    first = client.responses.create(input=[user], tool_choice="required", **ask)
    [call] = first.output
    assert call.type == "function_call"
    out = {
        "type": "function_call_output",
        "call_id": call.call_id,
        "output": json.dumps({"sky": "light rain", "celsius": 11, "wind_kmh": 20}),
    }
    chained = client.responses.create(input=[out], previous_response_id=first.id, **ask)
    whole = client.responses.create(input=[user, call.model_dump(), out], store=False, **ask)
    assert chained.output_text == whole.output_text
    assert chained.usage is not None and first.usage is not None
    # The stored input at least; the call's tokens up to where the template
    # writes it otherwise than the model did.
    cached = chained.usage.input_tokens_details.cached_tokens
    assert first.usage.input_tokens <= cached < first.usage.input_tokens + first.usage.output_tokens


def test_an_async_session_truncates_between_turns(model_path: Path) -> None:
    async def run() -> tuple[int, list[int], list[int]]:
        engine = AsyncEngine(model_path, context_size=256, threads=2, max_batch=2)
        try:
            sess = engine.session()
            await sess.generate("Once upon a time", 6, ignore_eos=True)
            before = sess.tokens
            assert await sess.truncate(3)
            with pytest.raises(ParameterError):
                await sess.truncate(4)
            return sess.n_past, sess.tokens, before
        finally:
            await engine.close()

    n_past, tokens, before = asyncio.run(run())
    assert n_past == 3 and tokens == before[:3]


def test_a_chat_session_turn_takes_strict_tools_under_auto(url: str) -> None:
    """The lazy call grammar (strict tools, tool_choice auto) on a session
    turn of the chat endpoint, which stored responses also run on (it was
    refused before): the same reply as without a session."""
    strict = {
        "type": "function",
        "function": {
            "name": WEATHER_TOOL["name"],
            "parameters": WEATHER_TOOL["parameters"],
            "strict": True,
        },
    }
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Always answer by calling get_weather."},
            {"role": "user", "content": "What's the weather in Paris?"},
        ],
        "tools": [strict],
        "temperature": 0,
        "max_tokens": 60,
    }

    def reply(headers: dict[str, str]) -> dict[str, Any]:
        r = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        msg: dict[str, Any] = r.json()["choices"][0]["message"]
        for call in msg.get("tool_calls") or []:
            call.pop("id")
        return msg

    session, plain = reply({"X-Session-Id": "strict-auto"}), reply({})
    assert session == plain
    # (SmolLM2 answers this in text: the grammar stays armed, unfired.)
    for call in session.get("tool_calls") or []:
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER_TOOL["parameters"])


def test_a_lazy_grammar_fires_in_a_session_turn(model_path: Path) -> None:
    """A session turn's grammar waits for its trigger, then holds the rest
    of the reply, as a one-shot request's does."""

    async def run() -> tuple[str, str, str]:
        engine = AsyncEngine(model_path, context_size=256, threads=2, max_batch=2)
        try:
            msgs = [{"role": "user", "content": "Say something."}]
            greedy = SamplerConfig.greedy()
            free = await engine.session(sampler=greedy).chat(msgs, 8)
            trigger = free.text.split()[0]
            grammar = 'root ::= " forty-two"'
            sess = engine.session(sampler=greedy)
            lazy = await sess.chat(msgs, 16, grammar=grammar, grammar_trigger=trigger)
            prompt = engine.tokenize(engine.engine.apply_chat_template(msgs))
            one_shot = await engine.generate(
                prompt, 16, sampler=greedy, grammar=grammar, grammar_trigger=trigger
            )
            return trigger, lazy.text, one_shot.text
        finally:
            await engine.close()

    trigger, lazy, one_shot = asyncio.run(run())
    assert lazy == one_shot
    assert lazy.endswith(trigger + " forty-two")
