"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's
Messages API over the chat endpoint's machinery (the same template
rendering, tool grammars, reasoning split and sessions)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from oxillama.decoding.completion import Completion
from oxillama.decoding.reasoning import ReasoningCap, ReasoningSplitter, opens_reasoning
from oxillama.decoding.sampling import SamplerConfig
from oxillama.decoding.tool_calls import ToolFormat
from oxillama.errors import OxiLlamaError
from oxillama.serving.async_engine import AsyncEngine
from oxillama.serving.http.access_log import note
from oxillama.serving.http.anthropic.blocks import Blocks
from oxillama.serving.http.anthropic.errors import anthropic_error, error_body
from oxillama.serving.http.anthropic.translate import chat_tools, check_blocks, conversation
from oxillama.serving.http.api_error import ApiError, from_library_error
from oxillama.serving.http.event_stream import EventStream, first_item, lease_closer
from oxillama.serving.http.json_body import parse_json_object
from oxillama.serving.http.raw_turn import RawTurn
from oxillama.serving.http.request_schemas import RequestSchemas
from oxillama.serving.http.session_table import Lease, SessionTable
from oxillama.serving.http.tools import ToolRequest, tool_request

__all__ = ["count_tokens", "messages"]

log = logging.getLogger("oxillama.server")

#: Seconds a stream may go without an event before a ``ping`` is sent.
PING_SECONDS = 10.0


class Server(Protocol):
    """What the routes need of the app's server (``app.Server``)."""

    engine: AsyncEngine
    tool_format: ToolFormat | None
    model_name: str
    vocab: int
    schemas: RequestSchemas
    defs: dict[str, Any]
    sessions: SessionTable
    splits_reasoning: bool
    reasoning_budget: int

    async def body(self, request: Request, schema: str) -> dict[str, Any]: ...

    def check_fits(self, n_prompt: int) -> None: ...


@dataclass(frozen=True)
class Prompt:
    """A request's rendered prompt and what generating from it takes."""

    messages: list[dict[str, Any]]
    variables: dict[str, Any]
    text: str
    tokens: list[int]
    tools: ToolRequest | None
    #: The prompt opened the reasoning (the reply starts inside it).
    inside: bool
    prefill: str


async def _checked_body(server: Server, request: Request, schema: str) -> dict[str, Any]:
    # Content blocks first, for errors that name an unsupported block.
    raw = parse_json_object(await request.body(), server.schemas.limits.max_json_depth)
    check_blocks(raw, server.defs)
    return await server.body(request, schema)


def _thinking(server: Server, body: Mapping[str, Any], variables: dict[str, Any]) -> None:
    """``thinking`` as the template's ``enable_thinking`` switch (Qwen3's);
    enabling it on a server that does not split reasoning is refused."""
    thinking = body.get("thinking")
    if thinking is None:
        if server.reasoning_budget == 0:
            variables["enable_thinking"] = False
        return
    if thinking["type"] == "disabled":
        variables["enable_thinking"] = False
        return
    choice = (body.get("tool_choice") or {}).get("type")
    if choice in ("any", "tool"):
        # As Anthropic's API: a forced call leaves no room to reason first.
        raise ApiError(
            400,
            f"thinking cannot be enabled when tool_choice forces a call ('{choice}'); "
            "use tool_choice 'auto' or 'none'",
            param="thinking",
        )
    if not server.splits_reasoning:
        raise ApiError(
            400,
            "thinking: this server does not split reasoning from replies (the model has no "
            "<think> markers, or it runs with --reasoning-format none); start it with "
            "--reasoning-format deepseek to get thinking blocks",
            param="thinking",
        )
    budget = thinking.get("budget_tokens")
    if budget is not None and "max_tokens" in body and budget >= body["max_tokens"]:
        raise ApiError(
            400,
            f"thinking.budget_tokens ({budget}) must be less than max_tokens "
            f"({body['max_tokens']})",
            param="thinking",
        )
    variables["enable_thinking"] = True


def render(server: Server, body: Mapping[str, Any]) -> Prompt:
    """The prompt of a checked Messages body, rendered as the chat
    endpoint renders its messages."""
    conv = conversation(body)
    chars = len(conv.prefill) + sum(
        len(m["content"]) for m in conv.messages if isinstance(m.get("content"), str)
    )
    if chars > server.schemas.prompt_chars:
        raise ApiError(
            400,
            f"the messages hold {chars} characters; at most {server.schemas.prompt_chars} "
            "could fit the context",
            param="messages",
        )
    engine = server.engine.engine
    treq = tool_request(chat_tools(body), engine.chat_template_source, server.tool_format)
    variables: dict[str, Any] = {}
    _thinking(server, body, variables)
    messages = conv.messages
    if treq is not None:
        messages, tool_vars = treq.template_input(messages)
        variables.update(tool_vars)
    text = engine.apply_chat_template(messages, **variables) + conv.prefill
    tokens = server.engine.tokenize(text)
    server.check_fits(len(tokens))
    inside = opens_reasoning(text) and not conv.prefill
    return Prompt(messages, variables, text, tokens, treq, inside, conv.prefill)


async def count_tokens(server: Server, request: Request) -> Response:
    body = await _checked_body(server, request, "CountTokensRequest")
    return JSONResponse({"input_tokens": len(render(server, body).tokens)})


def _generation_kwargs(server: Server, body: Mapping[str, Any], prompt: Prompt) -> dict[str, Any]:
    def get(key: str, default: Any) -> Any:
        v = body.get(key)
        return default if v is None else v

    sampler = SamplerConfig(
        temperature=float(get("temperature", 1.0)),
        top_p=float(get("top_p", 1.0)),
        # Past the vocabulary a top-k keeps everything.
        top_k=min(int(get("top_k", 0)), server.vocab),
    )
    kwargs: dict[str, Any] = {"sampler": sampler, "stop": list(get("stop_sequences", []))}
    # A LoRA adapter is picked by its name as the model, as on the chat endpoint.
    if body.get("model") in server.engine.loras:
        if body.get("session") is not None:
            raise ApiError(
                400, "a stateful session request cannot pick a LoRA adapter", param="model"
            )
        kwargs["lora"] = body["model"]
    treq = prompt.tools
    if treq is not None and treq.lazy is not None and body.get("session") is not None:
        raise ApiError(
            400,
            "strict tools with tool_choice 'auto' cannot continue a session",
            param="tools",
        )
    if treq is not None:
        kwargs.update(treq.grammar_kwargs())
    if body.get("session") is not None and prompt.prefill:
        raise ApiError(
            400,
            "a session turn cannot end with an assistant message to continue",
            param="messages",
        )
    kwargs.update(_thinking_cap(server, body, prompt))
    return kwargs


def _thinking_cap(server: Server, body: Mapping[str, Any], prompt: Prompt) -> dict[str, Any]:
    """``thinking.budget_tokens`` as a cap on the reply's reasoning tokens
    (see :class:`~oxillama.decoding.reasoning.ReasoningCap`): a session
    turn takes the budget, a one-shot request the cap on its own prompt."""
    thinking = body.get("thinking") or {}
    budget = thinking.get("budget_tokens")
    if thinking.get("type") != "enabled" or budget is None:
        return {}
    if body.get("session") is not None:
        return {"reasoning_budget": budget}
    engine = server.engine.engine
    cap = ReasoningCap.of(
        budget,
        lambda t: engine.tokenize(t, add_special=False, parse_special=True),
        inside=prompt.inside,
    )
    return {"reasoning_cap": cap}


def _stop_sequence(server: Server, out: Completion, stops: list[str]) -> str | None:
    """Which of ``stops`` ended ``out``: its tokens' text still holds the
    stop that ``text`` was cut at."""
    if out.finish_reason != "stop" or not stops:
        return None
    full = server.engine.engine.detokenize(out.tokens)
    # Generation stops at the first match: the earliest one is it.
    hits = [(at, -len(s), s) for s in stops if (at := full.find(s)) >= 0]
    return min(hits)[2] if hits else None


def _stop_reason(blocks: Blocks, out: Completion | None, stop: str | None) -> str:
    if blocks.calls:
        return "tool_use"
    if out is not None and out.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop is not None else "end_turn"


async def _next(pieces: AsyncIterator[str]) -> str | None:
    return await anext(pieces, None)


def _event(obj: Mapping[str, Any]) -> bytes:
    return f"event: {obj['type']}\ndata: {json.dumps(obj)}\n\n".encode()


async def messages(server: Server, request: Request) -> Response:
    body = await _checked_body(server, request, "MessagesRequest")
    prompt = render(server, body)
    kwargs = _generation_kwargs(server, body, prompt)
    record = note(request.state)
    record["prompt_tokens"] = len(prompt.tokens)
    sid = body.get("session")
    if sid is not None:
        record["session"] = sid
    max_tokens = int(body["max_tokens"])
    stops: list[str] = kwargs["stop"]
    mid = f"msg_{uuid.uuid4().hex}"
    model = body.get("model") or server.model_name
    thinking = body.get("thinking") or {}

    def new_blocks() -> Blocks:
        treq = prompt.tools
        return Blocks(
            ReasoningSplitter(inside=prompt.inside) if server.splits_reasoning else None,
            treq.fmt if treq is not None else None,
            single=bool((body.get("tool_choice") or {}).get("disable_parallel_tool_use")),
            omit_thinking=thinking.get("display") == "omitted",
        )

    def message(
        content: list[dict[str, Any]], out: Completion | None, reason: str | None, stop: str | None
    ) -> dict[str, Any]:
        return {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": stop,
            "usage": {
                "input_tokens": len(prompt.tokens),
                "output_tokens": len(out.tokens) if out is not None else 0,
            },
        }

    lease: Lease | None = await server.sessions.lease(sid) if sid is not None else None
    handed_over = False
    result: list[Completion] = []
    try:
        # The blocks split the raw reply themselves.
        turn = RawTurn(
            server.engine,
            None if lease is None else lease.session,
            prompt.messages,
            prompt.tokens,
            prompt.variables,
        )
        if not body.get("stream"):
            out = await turn.complete(max_tokens, **kwargs)
            if lease is not None:
                await lease.persist()
            record["completion_tokens"] = len(out.tokens)
            blocks = new_blocks()
            blocks.feed(out.text)
            blocks.finish()
            stop = _stop_sequence(server, out, stops)
            reason = _stop_reason(blocks, out, stop)
            return JSONResponse(message(blocks.content, out, reason, stop))
        pieces = turn.stream(max_tokens, result=result, **kwargs)
        first = await first_item(pieces)
        handed_over = True
    finally:
        if lease is not None and not handed_over:
            lease.release()

    close = lease_closer(pieces, lease)

    async def events() -> AsyncIterator[bytes]:
        blocks = new_blocks()
        try:
            yield _event({"type": "message_start", "message": message([], None, None, None)})
            yield _event({"type": "ping"})
            piece = first
            while piece is not None:
                for e in blocks.feed(piece):
                    yield _event(e)
                step = asyncio.ensure_future(_next(pieces))
                try:
                    # A quiet stream (a long prompt queued, a slow batch)
                    # still shows the client it is alive.
                    while not (await asyncio.wait({step}, timeout=PING_SECONDS))[0]:
                        yield _event({"type": "ping"})
                    piece = step.result()
                finally:
                    if not step.done():
                        step.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await step
            for e in blocks.finish():
                yield _event(e)
            if lease is not None:
                await lease.persist()
            out = result[0] if result else None
            record["completion_tokens"] = len(out.tokens) if out is not None else 0
            stop = _stop_sequence(server, out, stops) if out is not None else None
            yield _event(
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": _stop_reason(blocks, out, stop),
                        "stop_sequence": stop,
                    },
                    "usage": {"output_tokens": record["completion_tokens"]},
                }
            )
            yield _event({"type": "message_stop"})
        except OxiLlamaError as e:
            yield _event(anthropic_error(from_library_error(e))[1])
        except Exception:
            log.exception("a streamed message failed")
            yield _event(error_body("api_error", "internal server error"))
        finally:
            await close()

    return EventStream(events(), close)
