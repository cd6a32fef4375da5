"""``POST /v1/responses``, ``GET /v1/responses/{id}`` and ``DELETE
/v1/responses/{id}``: OpenAI's Responses API over the chat machinery
(templates, tool calls, reasoning, JSON schemas).

A stored response (``store``, the default) is a session of the server's
session table, under the response's id, holding the KV of its prompt and
reply (a decode leaves the bits a prefill of the same tokens leaves, see
``ops/attention.rs``). ``previous_response_id``
forks that session into the new response's and renders the whole
conversation: the session keeps the common prefix of its tokens and the
new prompt (the stored history, when the template renders it the same way
again) and evaluates only the rest, so the output is the one sending the
whole history would give, and ``usage.input_tokens_details.cached_tokens``
counts the tokens kept. The previous response stays as it was: it can be
continued again (a branch).
With ``store: false`` a continuation runs on a copy dropped afterwards,
and a request without a previous response runs without a session."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from oxillama.decoding.completion import Completion
from oxillama.decoding.reasoning import ReasoningSplitter, opens_reasoning
from oxillama.decoding.sampling import SamplerConfig
from oxillama.decoding.tool_calls import ToolFormat
from oxillama.engine.session_state import kept_prefix
from oxillama.errors import OxiLlamaError
from oxillama.serving.async_engine import AsyncEngine
from oxillama.serving.http.access_log import note
from oxillama.serving.http.api_error import ApiError, from_library_error
from oxillama.serving.http.event_stream import EventStream, first_item
from oxillama.serving.http.raw_turn import RawTurn
from oxillama.serving.http.responses.output import OutputItems
from oxillama.serving.http.responses.request import ResponseAsk, read_request
from oxillama.serving.http.responses.schema import RESPONSE_ID
from oxillama.serving.http.responses.store import StoredResponses
from oxillama.serving.http.session_table import Lease, SessionTable
from oxillama.serving.http.tools import ChoiceCalls, tool_request

__all__ = ["create_response", "delete_response", "get_response"]

log = logging.getLogger("oxillama.server")

_ID = re.compile(RESPONSE_ID.removeprefix("^").removesuffix("$"))


class Server(Protocol):
    """What the routes need of the app's server (``app.Server``)."""

    engine: AsyncEngine
    model_name: str
    n_ctx: int
    splits_reasoning: bool
    reasoning_budget: int
    tool_format: ToolFormat | None
    sessions: SessionTable
    responses: StoredResponses

    async def body(self, request: Request, schema: str) -> dict[str, Any]: ...

    def check_fits(self, n_prompt: int) -> None: ...


def _response_id(request: Request) -> str:
    rid = str(request.path_params["rid"])
    if _ID.fullmatch(rid) is None:
        raise ApiError(400, f"'{rid[:80]}' is not a response id (resp_...)", param="response_id")
    return rid


def _stored(server: Server, rid: str, param: str) -> dict[str, Any]:
    """The record of the stored response ``rid``; a 404 saying why when
    there is none (never stored, deleted, or its session evicted)."""
    record = server.responses.get(rid)
    if record is not None and server.sessions.has(rid):
        return record
    gone = server.sessions.gone_error(rid)
    if gone is not None:
        server.responses.delete(rid)
        gone.param = param
        raise gone
    if record is not None and server.sessions.folder is not None:
        # Its session never reached the folder (the server stopped
        # without a drain): the turns are known, the KV is not; a
        # continuation evaluates the whole conversation.
        return record
    raise ApiError(
        404, f"no stored response '{rid}' on this server", kind="not_found_error", param=param
    )


class _Turn:
    """One request, resolved: the prompt, what constrains the reply, the
    session it runs in."""

    def __init__(self, server: Server, ask: ResponseAsk) -> None:
        self.server, self.ask = server, ask
        self.rid = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())
        history: list[dict[str, Any]] = []
        if ask.previous_response_id is not None:
            history = _stored(server, ask.previous_response_id, "previous_response_id")[
                "conversation"
            ]
        #: The conversation without the instructions: what is stored.
        self.conversation = [*history, *ask.messages]
        if not self.conversation:
            raise ApiError(400, "'input' holds no items", param="input")
        messages = list(self.conversation)
        if ask.instructions:
            messages.insert(0, {"role": "system", "content": ask.instructions})
        eng = server.engine.engine
        self.treq = tool_request(ask.chat_tools, eng.chat_template_source, server.tool_format)
        self.kwargs: dict[str, Any] = {
            "sampler": SamplerConfig(temperature=ask.temperature, top_p=ask.top_p),
        }
        if ask.json_schema is not None:
            self.kwargs["json_schema"] = ask.json_schema
        self.variables: dict[str, Any] = {}
        if server.reasoning_budget == 0:
            self.variables["enable_thinking"] = False
        treq = self.treq
        if treq is not None:
            if treq.constrained and ask.json_schema:
                raise ApiError(
                    400,
                    "a required or strict tool call has its own grammar: drop text.format, "
                    "or use non-strict tools with tool_choice 'auto'",
                    param="text",
                )
            self.kwargs.update(treq.grammar_kwargs())
            messages, tool_vars = treq.template_input(messages)
            self.variables.update(tool_vars)
        self.messages = messages
        text = eng.apply_chat_template(messages, **self.variables)
        self.inside = opens_reasoning(text)
        self.tokens = server.engine.tokenize(text)
        server.check_fits(len(self.tokens))
        self.max_tokens = ask.max_output_tokens or min(256, server.n_ctx)
        #: The session it runs in: its own when stored, a copy of the
        #: previous one dropped afterwards when not.
        self.sid: str | None = None
        if ask.store:
            self.sid = self.rid
        elif ask.previous_response_id is not None:
            self.sid = f"resp_tmp_{uuid.uuid4().hex}"
        self.lease: Lease | None = None
        self.cached = 0

    async def enter(self) -> None:
        """Takes the session (a copy of the previous response's, when it
        continues one whose session is still here)."""
        if self.sid is None:
            return
        prev = self.ask.previous_response_id
        if prev is not None:
            await self.server.sessions.fork(prev, self.sid)
        self.lease = await self.server.sessions.lease(self.sid)
        held = self.lease.session.tokens
        self.cached = kept_prefix(held, self.tokens) if held else 0

    async def leave(self, finished: bool) -> None:
        """Ends the turn: the session persisted (with --persist-turns) and
        released; a temporary copy, or the session of a response that did
        not finish, is dropped."""
        lease, self.lease = self.lease, None
        if lease is None:
            return
        try:
            if finished and self.ask.store:
                # The session keeps the reply's KV too: decoding leaves the
                # bits a prefill of the same tokens would, so a continuation
                # evaluates only its new input and gives the tokens sending
                # the whole history gives.
                await lease.persist()
        finally:
            lease.release()
        if not finished or not self.ask.store:
            assert self.sid is not None
            await self.server.sessions.delete(self.sid)

    def raw(self) -> RawTurn:
        """The reply as the model writes it (the output items split it),
        in the session when the turn holds one."""
        session = None if self.lease is None else self.lease.session
        return RawTurn(self.server.engine, session, self.messages, self.tokens, self.variables)

    def output(self) -> OutputItems:
        split = ReasoningSplitter(inside=self.inside) if self.server.splits_reasoning else None
        calls = ChoiceCalls(self.treq.fmt) if self.treq is not None else None
        return OutputItems(split, calls)

    def response(
        self, status: str, out: OutputItems | None, done: Completion | None
    ) -> dict[str, Any]:
        ask = self.ask
        usage = None
        incomplete = None
        if done is not None and out is not None:
            n_in, n_out = len(self.tokens), len(done.tokens)
            reasoning = out.reasoning
            n_reason = (
                len(self.server.engine.tokenize(reasoning, add_special=False)) if reasoning else 0
            )
            usage = {
                "input_tokens": n_in,
                "input_tokens_details": {
                    "cached_tokens": self.cached,
                    "cache_write_tokens": n_in - self.cached if ask.store else 0,
                },
                "output_tokens": n_out,
                "output_tokens_details": {"reasoning_tokens": min(n_reason, n_out)},
                "total_tokens": n_in + n_out,
            }
            if done.finish_reason == "length":
                incomplete = {"reason": "max_output_tokens"}
        return {
            "id": self.rid,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": ask.instructions,
            "max_output_tokens": ask.max_output_tokens,
            "model": self.server.model_name,
            "output": [] if out is None else out.items,
            "parallel_tool_calls": ask.parallel_tool_calls,
            "previous_response_id": ask.previous_response_id,
            "store": ask.store,
            "temperature": ask.temperature,
            "text": {"format": ask.text_format},
            "tool_choice": ask.tool_choice,
            "tools": ask.tools,
            "top_p": ask.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": ask.user,
            "metadata": ask.metadata,
        }

    def finish(self, out: OutputItems, done: Completion, record: dict[str, Any]) -> dict[str, Any]:
        """The finished response, stored when asked."""
        status = "incomplete" if done.finish_reason == "length" else "completed"
        response = self.response(status, out, done)
        record["completion_tokens"] = len(done.tokens)
        if self.ask.store:
            conversation = [*self.conversation, *out.assistant_turns()]
            self.server.responses.put(self.rid, response, conversation)
            self.server.responses.keep_only(self.server.sessions.has)
        return response


def _sse(event: Mapping[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


async def create_response(server: Server, request: Request) -> Response:
    body = await server.body(request, "ResponseRequest")
    ask = read_request(body)
    turn = _Turn(server, ask)
    record = note(request.state)
    record["prompt_tokens"] = len(turn.tokens)
    if turn.sid is not None:
        record["session"] = turn.sid
    await turn.enter()
    if not ask.stream:
        finished = False
        try:
            done = await turn.raw().complete(turn.max_tokens, **turn.kwargs)
            out = turn.output()
            out.feed(done.text)
            out.finish(done.finish_reason == "length")
            finished = True
        finally:
            await turn.leave(finished)
        return JSONResponse(turn.finish(out, done, record))
    return await _stream(turn, record)


async def _stream(turn: _Turn, record: dict[str, Any]) -> Response:
    result: list[Completion] = []
    try:
        pieces = turn.raw().stream(turn.max_tokens, result=result, **turn.kwargs)
        first = await first_item(pieces)
    except BaseException:
        await turn.leave(False)
        raise
    finished = False

    async def close() -> None:
        try:
            await pieces.aclose()
        finally:
            await turn.leave(finished)

    async def events() -> AsyncIterator[bytes]:
        nonlocal finished
        seq = 0

        def numbered(ev: dict[str, Any]) -> bytes:
            nonlocal seq
            ev["sequence_number"] = seq
            seq += 1
            return _sse(ev)

        out = turn.output()
        shell = turn.response("in_progress", None, None)
        try:
            yield numbered({"type": "response.created", "response": shell})
            yield numbered({"type": "response.in_progress", "response": shell})
            piece = first
            while piece is not None:
                for ev in out.feed(piece):
                    yield numbered(ev)
                piece = await anext(pieces, None)
            done = result[0]
            for ev in out.finish(done.finish_reason == "length"):
                yield numbered(ev)
            finished = True
            await turn.leave(True)
            response = turn.finish(out, done, record)
            kind = (
                "response.completed" if response["status"] == "completed" else "response.incomplete"
            )
            yield numbered({"type": kind, "response": response})
        except OxiLlamaError as e:
            err = from_library_error(e)
            yield numbered(
                {"type": "error", "code": err.code, "message": err.message, "param": err.param}
            )
        except Exception:
            log.exception("a streamed response failed")
            yield numbered(
                {
                    "type": "error",
                    "code": "server_error",
                    "message": "internal server error",
                    "param": None,
                }
            )
        finally:
            await close()

    return EventStream(events(), close)


async def get_response(server: Server, request: Request) -> Response:
    rid = _response_id(request)
    if request.query_params:
        names = ", ".join(sorted(request.query_params))
        raise ApiError(400, f"query parameters are not supported here: {names}", param="query")
    return JSONResponse(_stored(server, rid, "response_id")["response"])


async def delete_response(server: Server, request: Request) -> Response:
    rid = _response_id(request)
    had_session = await server.sessions.delete(rid)
    had_record = server.responses.delete(rid)
    if not (had_session or had_record):
        raise ApiError(
            404,
            f"no stored response '{rid}' on this server",
            kind="not_found_error",
            param="response_id",
        )
    return JSONResponse({"id": rid, "object": "response", "deleted": True})
