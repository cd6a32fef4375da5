"""Anthropic's Messages API on the server, driven by the real ``anthropic``
SDK and LangChain's ``ChatAnthropic``: replies and their event stream,
stop reasons, a forced tool and its result turn, token counts, thinking
blocks, sessions, keys and errors in Anthropic's shape.

SmolLM2 is no thinking model: for the thinking tests an engine runs every
generation under a grammar that writes the reasoning markers, and the
server splits them (``--reasoning-format deepseek``)."""

from __future__ import annotations

import asyncio
import itertools
import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anthropic
import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_anthropic import ChatAnthropic
from starlette.testclient import TestClient

from oxillama import AsyncEngine, Completion
from oxillama.decoding.reasoning import ReasoningSplitter
from oxillama.serving.http import Limits, build_app
from oxillama.serving.http.anthropic import routes
from oxillama.serving.http.anthropic.blocks import Blocks
from oxillama.serving.http.anthropic.errors import anthropic_error
from oxillama.serving.http.anthropic.routes import _generation_kwargs, render
from oxillama.serving.http.anthropic.translate import check_blocks
from oxillama.serving.http.api_error import ApiError
from oxillama.serving.http.schema_check import SchemaViolation, check
from tests._gguf_meta import ModelMissing, gemma3_path
from tests._serve import serving

MODEL = "smollm2"
KEY = "sk-messages-test"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"],
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
TOOLS: Any = [
    {"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER},
    {"name": "add", "description": "Adds two integers", "input_schema": ADD},
]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}
ASK: Any = [{"role": "user", "content": "What's the weather in Paris?"}]
CHAT: Any = [
    {"role": "user", "content": "Hi! What is your name?"},
    {"role": "assistant", "content": "I am a small assistant."},
    {"role": "user", "content": "Name three colours."},
]
SYSTEM = "You are brief."
#: The SDK no longer has sampling parameters; the API (and this server) still
#: takes them.
GREEDY = {"temperature": 0}

REASONING, ANSWER = "The capital is Paris.", "Paris"
REPLY = f"<think>\n{REASONING}</think>\n\n{ANSWER}"
GRAMMAR = 'root ::= "' + REPLY.replace("\n", "\\n") + '"'


class ThinkingEngine(AsyncEngine):
    """Every generation writes ``REPLY`` (a grammar forces it)."""

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        return super().stream(*args, **{**kwargs, "grammar": GRAMMAR})

    async def generate(self, *args: Any, **kwargs: Any) -> Completion:
        return await super().generate(*args, **{**kwargs, "grammar": GRAMMAR})


@pytest.fixture(scope="module")
def url(model_path: Path) -> Iterator[str]:
    engine = AsyncEngine(model_path, context_size=1024, threads=2, max_batch=4)
    with serving(engine, MODEL, api_keys=(KEY,)) as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def thinking_engine(model_path: Path) -> ThinkingEngine:
    # serving() closes it when the thinker's server stops.
    return ThinkingEngine(model_path, context_size=2048, threads=2, max_batch=2)


@pytest.fixture(scope="module")
def thinker(thinking_engine: ThinkingEngine) -> Iterator[anthropic.Anthropic]:
    with serving(thinking_engine, MODEL, reasoning_format="deepseek") as base:
        yield anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)


def post(url: str, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", "x-api-key": KEY, **(headers or {})}
    req = urllib.request.Request(url + path, data, hdrs)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def text_of(content: Sequence[Any]) -> str:
    return "".join(b.text for b in content if b.type == "text")


# ---------------------------------------------------------------- replies


def test_create_answers_a_multi_turn_conversation(client: anthropic.Anthropic, url: str) -> None:
    r = client.messages.create(
        model=MODEL, system=SYSTEM, messages=CHAT, max_tokens=24, extra_body=GREEDY
    )
    assert r.id.startswith("msg_") and r.type == "message" and r.role == "assistant"
    assert r.model == MODEL
    assert [b.type for b in r.content] == ["text"] and text_of(r.content).strip()
    assert r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None
    counted = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=CHAT)
    assert r.usage.input_tokens == counted.input_tokens > 0
    assert 0 < r.usage.output_tokens <= 24
    with urllib.request.urlopen(url + "/metrics", timeout=30) as m:
        metrics = m.read().decode()
    for route in ("/v1/messages", "/v1/messages/count_tokens"):
        assert f'oxillama:http_requests_total{{route="{route}",status="200"}}' in metrics


def wire_events(url: str, body: Any) -> list[tuple[str, Any]]:
    """A streamed request's events as sent: each ``event:`` line's name
    and its ``data:`` line's JSON."""
    req = urllib.request.Request(
        url + "/v1/messages",
        json.dumps({**body, "stream": True}).encode(),
        {"Content-Type": "application/json", "x-api-key": KEY},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        text = r.read().decode()
    out = []
    for chunk in text.split("\n\n"):
        if not chunk.strip():
            continue
        name, data = chunk.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), chunk
        event = json.loads(data[6:])
        assert event["type"] == name[7:]
        out.append((name[7:], event))
    return out


def test_stream_events_come_in_anthropics_order(client: anthropic.Anthropic, url: str) -> None:
    body = {"model": MODEL, "system": SYSTEM, "messages": CHAT, "max_tokens": 24, **GREEDY}
    events = wire_events(url, body)
    kinds = [k for k, _ in events]
    assert kinds[:2] == ["message_start", "ping"]
    assert kinds[-2:] == ["message_delta", "message_stop"]
    blocks = kinds[2:-2]
    assert blocks[0] == "content_block_start" and blocks[-1] == "content_block_stop"
    assert set(blocks[1:-1]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    with client.messages.stream(
        model=MODEL, system=SYSTEM, messages=CHAT, max_tokens=24, extra_body=GREEDY
    ) as s:
        final = s.get_final_message()
    whole = client.messages.create(
        model=MODEL, system=SYSTEM, messages=CHAT, max_tokens=24, extra_body=GREEDY
    )
    # Greedy: the streamed blocks are the whole reply's.
    assert text_of(final.content) == text_of(whole.content)
    assert final.stop_reason == whole.stop_reason == delta["delta"]["stop_reason"]
    assert final.usage.output_tokens == whole.usage.output_tokens == delta["usage"]["output_tokens"]
    assert final.usage.input_tokens == whole.usage.input_tokens


def test_a_quiet_stream_sends_pings(
    client: anthropic.Anthropic, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Any wait between pieces is "quiet" at this bound.
    monkeypatch.setattr(routes, "PING_SECONDS", 1e-6)
    body = {"model": MODEL, "system": SYSTEM, "messages": CHAT, "max_tokens": 24, **GREEDY}
    kinds = [k for k, _ in wire_events(url, body)]
    assert kinds.count("ping") > 1
    # Pings aside, the order is unchanged.
    rest = [k for k in kinds if k != "ping"]
    assert rest[0] == "message_start" and rest[-2:] == ["message_delta", "message_stop"]
    with client.messages.stream(
        model=MODEL, system=SYSTEM, messages=CHAT, max_tokens=24, extra_body=GREEDY
    ) as s:
        final = s.get_final_message()
    whole = client.messages.create(
        model=MODEL, system=SYSTEM, messages=CHAT, max_tokens=24, extra_body=GREEDY
    )
    assert text_of(final.content) == text_of(whole.content)
    # A client leaving mid-stream, a ping's wait pending, frees the server.
    for _ in range(3):
        with client.messages.stream(
            model=MODEL, messages=CHAT, max_tokens=200, extra_body=GREEDY
        ) as s:
            next(iter(s))
    assert client.messages.create(model=MODEL, messages=CHAT, max_tokens=2).content


def test_sampling_fields_reach_the_sampler(client: anthropic.Anthropic) -> None:
    kw: Any = {"model": MODEL, "messages": CHAT, "max_tokens": 16}
    greedy = text_of(client.messages.create(**kw, extra_body=GREEDY).content)
    # At temperature 1, a top-k of 1 or a vanishing top-p leaves the likeliest token.
    for narrow in ({"top_k": 1}, {"top_p": 1e-9}):
        r = client.messages.create(
            **kw, metadata={"user_id": "u-1"}, extra_body={"temperature": 1, **narrow}
        )
        assert text_of(r.content) == greedy, narrow
    with pytest.raises(anthropic.BadRequestError, match="temperature"):
        client.messages.create(**kw, extra_body={"temperature": 1.5})


def test_stop_reasons_max_tokens_and_stop_sequence(client: anthropic.Anthropic) -> None:
    r = client.messages.create(model=MODEL, messages=CHAT, max_tokens=2, extra_body=GREEDY)
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 2
    long = text_of(
        client.messages.create(model=MODEL, messages=CHAT, max_tokens=24, extra_body=GREEDY).content
    )
    words = long.split()
    stop = words[len(words) // 2]
    for stream in (False, True):
        kw: Any = {"model": MODEL, "messages": CHAT, "max_tokens": 24, "extra_body": GREEDY}
        if stream:
            with client.messages.stream(**kw, stop_sequences=["@@never@@", stop]) as s:
                cut = s.get_final_message()
        else:
            cut = client.messages.create(**kw, stop_sequences=["@@never@@", stop])
        assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop, stream
        assert text_of(cut.content) == long[: long.index(stop)]


def test_count_tokens_is_the_rendered_prompts_length(client: anthropic.Anthropic, url: str) -> None:
    counted = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=CHAT)
    chat = [{"role": "system", "content": SYSTEM}, *CHAT]
    status, rendered = post(url, "/apply-template", {"messages": chat})
    assert status == 200, rendered
    status, ids = post(url, "/tokenize", {"content": rendered["prompt"], "add_special": True})
    assert status == 200, ids
    assert counted.input_tokens == len(ids["tokens"])
    # Tools are part of the prompt, and of its count.
    with_tools = client.messages.count_tokens(model=MODEL, messages=CHAT, tools=TOOLS)
    assert (
        with_tools.input_tokens
        > client.messages.count_tokens(model=MODEL, messages=CHAT).input_tokens
    )


# ---------------------------------------------------------------- tools


def test_a_forced_tool_then_its_result(client: anthropic.Anthropic) -> None:
    r = client.messages.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        max_tokens=80,
        extra_body=GREEDY,
    )
    assert r.stop_reason == "tool_use"
    uses = [b for b in r.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    jsonschema.validate(uses[0].input, WEATHER)
    history: Any = [
        *ASK,
        {"role": "assistant", "content": r.content},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": uses[0].id, "content": "18 C and sunny"}
            ],
        },
    ]
    answer = client.messages.create(
        model=MODEL, messages=history, tools=TOOLS, max_tokens=32, extra_body=GREEDY
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in answer.content] == ["text"] and text_of(answer.content).strip()
    # The result is in the prompt: it counts.
    longer = json.loads(json.dumps(history[:2], default=lambda b: b.model_dump()))
    longer.append({**history[2], "content": [{**history[2]["content"][0], "content": "1" * 40}]})
    full = client.messages.count_tokens(model=MODEL, messages=history, tools=TOOLS)
    assert (
        client.messages.count_tokens(model=MODEL, messages=longer, tools=TOOLS).input_tokens
        > full.input_tokens
    )
    # An error result renders too, as does a history with no tools offered.
    failed: Any = [
        *history[:2],
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": uses[0].id,
                    "content": [{"type": "text", "text": "unknown city"}],
                    "is_error": True,
                },
                {"type": "text", "text": "Try again later."},
            ],
        },
    ]
    again = client.messages.create(model=MODEL, messages=failed, max_tokens=8, extra_body=GREEDY)
    assert again.content and again.stop_reason in ("end_turn", "max_tokens")


def test_a_streamed_forced_call_sends_its_input_as_json_deltas(
    client: anthropic.Anthropic,
) -> None:
    kw: Any = {
        "model": MODEL,
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "max_tokens": 80,
        "extra_body": GREEDY,
    }
    partial = ""
    starts: list[str] = []
    with client.messages.stream(**kw) as s:
        for event in s:
            if event.type == "content_block_start":
                starts.append(event.content_block.type)
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial += event.delta.partial_json
        final = s.get_final_message()
    assert starts == ["tool_use"] and final.stop_reason == "tool_use"
    use = final.content[0]
    assert use.type == "tool_use"
    assert json.loads(partial) == use.input
    jsonschema.validate(use.input, SCHEMAS[use.name])
    whole = client.messages.create(**kw)
    assert [(b.type, getattr(b, "input", None)) for b in whole.content] == [("tool_use", use.input)]


def test_tool_choice_none_and_auto_reply_in_text(client: anthropic.Anthropic) -> None:
    for choice in ({"type": "none"}, {"type": "auto"}):
        r = client.messages.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Say hello."}],
            tools=TOOLS,
            tool_choice=choice,  # type: ignore[arg-type]
            max_tokens=12,
            extra_body=GREEDY,
        )
        assert r.content and r.content[0].type == "text", choice


def test_strict_tools_under_auto(
    client: anthropic.Anthropic, thinking_engine: ThinkingEngine, thinker: anthropic.Anthropic
) -> None:
    strict: Any = [{**t, "strict": True} for t in TOOLS]
    server = build_app(thinking_engine, model_name=MODEL).state.server
    body: Any = {"messages": ASK, "tools": strict, "max_tokens": 60}
    prompt = render(server, body)
    kwargs = _generation_kwargs(server, body, prompt)
    # A call, once its marker is written, runs under the tools' grammar.
    assert prompt.tools is not None and prompt.tools.lazy is not None
    assert (kwargs["grammar_trigger"], kwargs["grammar"]) == prompt.tools.lazy
    loose = {**body, "tools": TOOLS}
    plain = _generation_kwargs(server, loose, render(server, loose))
    assert "grammar" not in plain and "grammar_trigger" not in plain
    # The lazy grammar cannot run in a session turn: refused, not dropped.
    with pytest.raises(anthropic.BadRequestError, match="session"):
        client.messages.create(
            model=MODEL,
            messages=ASK,
            tools=strict,
            max_tokens=4,
            extra_headers={"X-Session-Id": "anthropic-strict"},
        )


# ---------------------------------------------------------------- langchain


def test_langchains_chat_anthropic_gets_a_reply(url: str) -> None:
    llm = ChatAnthropic(  # type: ignore[call-arg]
        model=MODEL, base_url=url, api_key=KEY, max_tokens=16, temperature=0, max_retries=0
    )
    reply = llm.invoke("Say hello.")
    assert isinstance(reply.content, str) and reply.content.strip()
    assert reply.response_metadata["stop_reason"] in ("end_turn", "max_tokens")


def test_langchain_binds_a_tool_and_gets_its_call(url: str) -> None:
    llm = ChatAnthropic(  # type: ignore[call-arg]
        model=MODEL, base_url=url, api_key=KEY, max_tokens=80, temperature=0, max_retries=0
    )
    reply = llm.bind_tools([TOOLS[0]], tool_choice="get_weather").invoke(
        "What's the weather in Paris?"
    )
    calls = reply.tool_calls  # type: ignore[attr-defined]
    assert [c["name"] for c in calls] == ["get_weather"]
    jsonschema.validate(calls[0]["args"], WEATHER)
    assert reply.response_metadata["stop_reason"] == "tool_use"


# ---------------------------------------------------------------- thinking


def test_thinking_blocks_whole_and_streamed(thinker: anthropic.Anthropic) -> None:
    kw: Any = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 1100,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    r = thinker.messages.create(**kw)
    assert [b.type for b in r.content] == ["thinking", "text"]
    assert r.content[0].thinking == REASONING and r.content[1].text == ANSWER  # type: ignore[union-attr]
    assert r.stop_reason == "end_turn"
    deltas: list[str] = []
    with thinker.messages.stream(**kw) as s:
        for event in s:
            if event.type == "content_block_delta":
                deltas.append(event.delta.type)
        final = s.get_final_message()
    # All the thinking comes before any of the answer.
    assert deltas[0] == "thinking_delta" and "text_delta" in deltas
    first_text = deltas.index("text_delta")
    assert set(deltas[:first_text]) == {"thinking_delta"}
    assert set(deltas[first_text:]) == {"text_delta"}
    assert [b.model_dump(exclude_none=True) for b in final.content] == [
        b.model_dump(exclude_none=True) for b in r.content
    ]
    # A thinking block sent back in the history is accepted (and not rendered again).
    again = thinker.messages.create(
        **{
            **kw,
            "messages": [
                *kw["messages"],
                {"role": "assistant", "content": r.content},
                {"role": "user", "content": "And of Italy?"},
            ],
        }
    )
    assert again.content[0].type == "thinking"
    omitted = thinker.messages.create(
        **{**kw, "thinking": {"type": "enabled", "budget_tokens": 1024, "display": "omitted"}}
    )
    assert omitted.content[0].type == "thinking" and omitted.content[0].thinking == ""
    with pytest.raises(anthropic.BadRequestError, match="tool_choice"):
        thinker.messages.create(**kw, tools=TOOLS, tool_choice={"type": "any"})  # type: ignore[union-attr]


def test_thinking_on_a_server_that_does_not_split_is_refused(
    client: anthropic.Anthropic,
) -> None:
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(
            model=MODEL,
            messages=ASK,
            max_tokens=16,
            thinking={"type": "adaptive"},  # type: ignore[typeddict-item]
        )
    assert e.value.status_code == 400
    assert e.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "thinking" in e.value.body["error"]["message"]  # type: ignore[index]


# ---------------------------------------------------------------- sessions


def test_x_session_id_keeps_the_conversation_live(client: anthropic.Anthropic, url: str) -> None:
    kw: Any = {"model": MODEL, "system": SYSTEM, "max_tokens": 12, "extra_body": GREEDY}
    first = client.messages.create(
        **kw, messages=CHAT[:1], extra_headers={"X-Session-Id": "anthropic-1"}
    )
    req = urllib.request.Request(url + "/v1/sessions/anthropic-1", headers={"x-api-key": KEY})
    with urllib.request.urlopen(req, timeout=30) as r:
        held = json.loads(r.read())
    assert held["live"] and held["tokens"] > first.usage.input_tokens
    turn: Any = [
        *CHAT[:1],
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": "Name three colours."},
    ]
    with client.messages.stream(
        **kw, messages=turn, extra_headers={"X-Session-Id": "anthropic-1"}
    ) as s:
        continued = s.get_final_message()
    # Greedy: the session's turn is the stateless reply to the whole history.
    fresh = client.messages.create(**kw, messages=turn)
    assert text_of(continued.content) == text_of(fresh.content)


# ---------------------------------------------------------------- errors


def _error(status: int, body: Any, kind: str, *words: str) -> None:
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    for w in words:
        assert w in body["error"]["message"], body


def test_an_image_block_is_refused_by_name(url: str) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    for content in (
        [{"type": "text", "text": "What is this?"}, image],
        [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [image]}],
    ):
        status, body = post(
            url,
            "/v1/messages",
            {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": content}]},
        )
        assert status == 400
        _error(status, body, "invalid_request_error", '"image"', "messages[0].content[")


def test_unknown_fields_and_a_missing_max_tokens_are_named(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(
            model=MODEL, messages=ASK, max_tokens=4, extra_body={"service_tier": "auto"}
        )
    _error(400, e.value.body, "invalid_request_error", "service_tier")
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(
            model=MODEL,
            messages=ASK,
            max_tokens=4,
            tools=[{"type": "web_search_20250305", "name": "web_search"}],  # type: ignore[list-item]
        )
    _error(400, e.value.body, "invalid_request_error", "tools[0]")
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(
            model=MODEL, messages=ASK, max_tokens=4, extra_body={"max_tokens": None}
        )
    _error(400, e.value.body, "invalid_request_error", "max_tokens")


def test_missing_max_tokens(url: str) -> None:
    status, body = post(url, "/v1/messages", {"model": MODEL, "messages": ASK})
    assert status == 400
    _error(status, body, "invalid_request_error", "max_tokens", "required")


def test_keys_x_api_key_and_bearer_are_accepted_a_bad_one_is_401(url: str) -> None:
    body = {"model": MODEL, "messages": ASK}
    assert post(url, "/v1/messages/count_tokens", body)[0] == 200
    bearer = {"x-api-key": "", "Authorization": f"Bearer {KEY}"}
    assert post(url, "/v1/messages/count_tokens", body, bearer)[0] == 200
    bad = anthropic.Anthropic(base_url=url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model=MODEL, messages=ASK, max_tokens=4)
    assert e.value.status_code == 401
    _error(401, e.value.body, "authentication_error", "incorrect API key")
    status, out = post(url, "/v1/messages", body, {"x-api-key": ""})
    assert status == 401
    _error(status, out, "authentication_error", "x-api-key")


def test_an_unknown_model_is_not_found(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="claude-nonesuch", messages=ASK, max_tokens=4)
    _error(404, e.value.body, "not_found_error", "claude-nonesuch")


def test_errors_before_the_route_are_in_anthropics_shape(
    thinking_engine: ThinkingEngine, thinker: anthropic.Anthropic
) -> None:
    app = build_app(thinking_engine, model_name=MODEL, limits=Limits(max_body_bytes=512))
    with TestClient(app) as c:
        r = c.post("/v1/messages", json={"messages": [{"role": "user", "content": "x" * 600}]})
        assert r.status_code == 413
        _error(413, r.json(), "request_too_large")
        r = c.get("/v1/messages")
        assert r.status_code == 405
        _error(405, r.json(), "invalid_request_error")
        # The OpenAI routes keep OpenAI's shape.
        r = c.get("/v1/chat/completions")
        assert r.status_code == 405 and "type" not in r.json()


def test_statuses_map_to_anthropics_types() -> None:
    assert anthropic_error(ApiError(503, "full", kind="server_error")) == (
        529,
        {"type": "error", "error": {"type": "overloaded_error", "message": "full"}},
    )
    status, body = anthropic_error(ApiError(400, "must be a number", param="top_p"))
    assert status == 400 and body["error"] == {
        "type": "invalid_request_error",
        "message": "top_p: must be a number",
    }
    assert anthropic_error(ApiError(500, "boom"))[1]["error"]["type"] == "api_error"


# ---------------------------------------------------------------- prefill


def test_a_final_assistant_turn_is_continued(client: anthropic.Anthropic, url: str) -> None:
    prefill = "The three colours are"
    turn: Any = [*CHAT, {"role": "assistant", "content": prefill}]
    r = client.messages.create(model=MODEL, messages=turn, max_tokens=12, extra_body=GREEDY)
    status, rendered = post(url, "/apply-template", {"messages": CHAT})
    assert status == 200, rendered
    status, plain = post(
        url,
        "/v1/completions",
        {"prompt": rendered["prompt"] + prefill, "max_tokens": 12, "temperature": 0},
    )
    assert status == 200, plain
    # The reply is the continuation alone, as the prompt plus prefill gives it.
    assert text_of(r.content) == plain["choices"][0]["text"]
    assert r.usage.input_tokens == plain["usage"]["prompt_tokens"]


# ---------------------------------------------------------------- documents


@pytest.fixture(scope="module")
def document(url: str) -> Any:
    with urllib.request.urlopen(url + "/openapi.json", timeout=30) as r:
        return json.loads(r.read())


def test_the_openapi_document_describes_the_replies(document: Any, url: str) -> None:
    doc = document
    ops = {p: doc["paths"][p]["post"] for p in ("/v1/messages", "/v1/messages/count_tokens")}
    for op in ops.values():
        assert {"200", "400", "401", "413", "529"} <= set(op["responses"])

    def conforms(path: str, status: str, body: Any) -> None:
        schema = ops[path]["responses"][status]["content"]["application/json"]["schema"]
        root = {**schema, "components": doc["components"]}
        jsonschema.validate(body, root, cls=jsonschema.Draft202012Validator)

    for body in (
        {"model": MODEL, "messages": CHAT, "max_tokens": 4},
        {"messages": ASK, "tools": TOOLS, "tool_choice": {"type": "any"}, "max_tokens": 60},
    ):
        status, out = post(url, "/v1/messages", body)
        assert status == 200, out
        conforms("/v1/messages", "200", out)
    status, out = post(url, "/v1/messages/count_tokens", {"messages": CHAT})
    assert status == 200
    conforms("/v1/messages/count_tokens", "200", out)
    status, out = post(url, "/v1/messages", {"messages": CHAT})
    assert status == 400
    conforms("/v1/messages", "400", out)


BLOCK = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image", [], 3])},
    optional={
        "text": st.sampled_from(["", "hi", 3, None]),
        "id": st.sampled_from(["toolu_1", "bad id", ""]),
        "name": st.sampled_from(["f", "", "a" * 65]),
        "input": st.sampled_from([{}, {"a": 1}, [], None]),
        "tool_use_id": st.sampled_from(["toolu_1", ""]),
        "content": st.sampled_from(["r", [], [{"type": "text", "text": "r"}], 1]),
        "is_error": st.sampled_from([True, None, "yes"]),
        "thinking": st.sampled_from(["t", None]),
        "cache_control": st.sampled_from([{"type": "ephemeral"}, {"type": "x"}, None]),
        "citations": st.sampled_from([None, []]),
    },
)
VALUES = st.sampled_from(
    [
        None,
        0,
        1,
        0.5,
        1.5,
        1024,
        -1,
        "x",
        "",
        [],
        ["s"],
        {},
        {"type": "auto"},
        {"type": "tool"},
        {"type": "tool", "name": "f"},
        {"type": "enabled"},
        {"type": "enabled", "budget_tokens": 1024},
        {"type": "adaptive", "display": "omitted"},
        {"user_id": "u"},
        [{"name": "f", "input_schema": {}}],
        [{"type": "text", "text": "s"}],
    ]
)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_the_servers_checker_agrees_with_a_reference_validator(
    document: dict[str, Any], data: st.DataObject
) -> None:
    schemas = document["components"]["schemas"]
    name = data.draw(st.sampled_from(["MessagesRequest", "CountTokensRequest"]))
    fields = [*schemas[name]["properties"], "unknown"]
    body: dict[str, Any] = {"messages": ASK, "max_tokens": 4}
    body.update(data.draw(st.dictionaries(st.sampled_from(fields), VALUES, max_size=2)))
    if data.draw(st.booleans()):
        role = data.draw(st.sampled_from(["user", "assistant", "system"]))
        body["messages"] = [{"role": role, "content": data.draw(st.lists(BLOCK, max_size=2))}]
    root = {"$ref": f"#/components/schemas/{name}", "components": {"schemas": schemas}}
    reference = jsonschema.Draft202012Validator(root).is_valid(body)
    # The block pre-check refuses what the schema refuses, by name, and never fails
    # otherwise.
    try:
        check_blocks(body, schemas)
    except SchemaViolation:
        assert not reference, body
    except ApiError as e:
        assert not reference or "belongs in" in e.message, body
    try:
        check(body, schemas[name], "", schemas)
        ours = True
    except SchemaViolation:
        ours = False
    assert ours == reference, body


def test_a_lora_adapter_is_picked_by_its_name_as_the_model() -> None:
    # The generation arguments alone: loading an adapter costs seconds.
    server = SimpleNamespace(engine=SimpleNamespace(loras={"alpha": object()}), vocab=100)
    prompt = SimpleNamespace(tools=None, prefill="")
    body: Any = {"model": "alpha", "messages": ASK, "max_tokens": 4}
    kwargs = _generation_kwargs(server, body, prompt)  # type: ignore[arg-type]
    assert kwargs["lora"] == "alpha"
    assert "lora" not in _generation_kwargs(server, {**body, "model": MODEL}, prompt)  # type: ignore[arg-type]
    with pytest.raises(ApiError, match="LoRA"):
        _generation_kwargs(server, {**body, "session": "s1"}, prompt)  # type: ignore[arg-type]


# ---------------------------------------------------------------- histories


CALL = {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Paris"}}
SECOND = {"type": "tool_use", "id": "toolu_b", "name": "add", "input": {"a": 20, "b": 22}}
HISTORIES: Any = {
    "one call": [
        *ASK,
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, CALL]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": "18 C"}],
        },
    ],
    "two calls, a failed one, then text": [
        *ASK,
        {"role": "assistant", "content": [CALL, SECOND]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_a",
                    "content": [{"type": "text", "text": "18 C"}],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_b",
                    "content": "42",
                    "is_error": True,
                },
                {"type": "text", "text": "Thanks!"},
            ],
        },
    ],
    "thinking before a call": [
        *ASK,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "SECRET-REASONING", "signature": ""},
                CALL,
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": "18 C"}],
        },
    ],
}


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def any_app(request: pytest.FixtureRequest, model_path: Path) -> Iterator[Any]:
    try:
        path = model_path if request.param == "smollm2" else gemma3_path()
    except ModelMissing as e:  # fail, never skip
        pytest.fail(str(e), pytrace=False)
    engine = AsyncEngine(path, context_size=1024, threads=2, max_batch=1)
    yield build_app(engine, model_name=request.param)
    asyncio.run(engine.close())


@pytest.mark.parametrize("history", sorted(HISTORIES))
@pytest.mark.parametrize(
    "tools",
    [{}, {"tools": TOOLS}, {"tools": TOOLS, "tool_choice": {"type": "none"}}],
    ids=["no tools", "tools", "tool_choice none"],
)
def test_every_tool_history_renders_through_each_models_template(
    any_app: Any, history: str, tools: dict[str, Any]
) -> None:
    body = {"messages": HISTORIES[history], **tools}
    with TestClient(any_app) as c:
        r = c.post("/v1/messages/count_tokens", json=body)
        assert r.status_code == 200, r.text
    prompt = render(any_app.state.server, body)
    assert r.json()["input_tokens"] == len(prompt.tokens)
    for part in ("Paris", "18 C", "get_weather"):
        assert part in prompt.text, (history, part)
    if "two calls" in history:
        assert "Error: 42" in prompt.text and "Thanks!" in prompt.text and "add" in prompt.text
    # Earlier thinking is not rendered again.
    assert "SECRET-REASONING" not in prompt.text


# ---------------------------------------------------------------- blocks

REPLIES = [
    # (reply text, the prompt opened the reasoning)
    (
        "<think>\nWhy not.</think>\n\nHello <tool_call>\n"
        '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
        False,
    ),
    (
        'Why not.</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}'
        '\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
        "\n</tool_call>",
        True,
    ),
    ("Just text, no markers </think> at all.", False),
    ('  \n<tool_call>\n{"name": "add", "arguments": {"a": 1}', False),
]


def _stream_blocks(text: str, inside: bool, cuts: list[int]) -> tuple[list[Any], list[Any]]:
    blocks = Blocks(ReasoningSplitter(inside=inside), "qwen")
    bounds = [0, *sorted({c % (len(text) + 1) for c in cuts}), len(text)]
    events = [e for a, b in itertools.pairwise(bounds) for e in blocks.feed(text[a:b])]
    return events + blocks.finish(), blocks.content


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=300), max_size=10))
def test_blocks_are_the_same_however_the_reply_is_cut(cuts: list[int]) -> None:
    for text, inside in REPLIES:
        _, whole = _stream_blocks(text, inside, [])
        events, content = _stream_blocks(text, inside, cuts)
        strip = [{k: v for k, v in b.items() if k != "id"} for b in content]
        assert strip == [{k: v for k, v in b.items() if k != "id"} for b in whole]
        # Every block starts, gets its deltas, and stops, one at a time, in order.
        rebuilt: list[dict[str, Any]] = []
        open_at = None
        for e in events:
            if e["type"] == "content_block_start":
                assert open_at is None and e["index"] == len(rebuilt)
                rebuilt.append(dict(e["content_block"]))
                open_at = e["index"]
            elif e["type"] == "content_block_delta":
                assert e["index"] == open_at
                d, b = e["delta"], rebuilt[-1]
                if d["type"] == "input_json_delta":
                    b["input"] = json.loads(d["partial_json"])
                else:
                    key = "thinking" if d["type"] == "thinking_delta" else "text"
                    b[key] += d[key]
            else:
                assert e == {"type": "content_block_stop", "index": open_at}
                open_at = None
        assert open_at is None and rebuilt == content


def test_the_blocks_of_each_reply() -> None:
    kinds = [[b["type"] for b in _stream_blocks(t, i, [])[1]] for t, i in REPLIES]
    assert kinds == [
        ["thinking", "text", "tool_use"],
        ["thinking", "tool_use", "tool_use"],
        ["text"],
        # An unfinished call is text; the blank before it stays with it.
        ["text"],
    ]
    first = _stream_blocks(*REPLIES[0], [])[1]
    assert first[0]["thinking"] == "Why not." and first[1]["text"] == "Hello "
    assert first[2]["input"] == {"a": 1, "b": 2} and first[2]["id"].startswith("toolu_")
    blocks = Blocks(None, "qwen", single=True)
    blocks.feed(REPLIES[1][0].split("</think>\n\n")[1])
    blocks.finish()
    assert [b["name"] for b in blocks.content] == ["add"] and blocks.calls == 1
