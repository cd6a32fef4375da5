"""The routes and :func:`build_app`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from oxillama.decoding.completion import Completion
from oxillama.decoding.reasoning import (
    ReasoningFormat,
    ReasoningSplitter,
    check_reasoning,
    opens_reasoning,
    speaks_harmony,
    split_reasoning,
    thinks,
)
from oxillama.decoding.sampling import SamplerConfig
from oxillama.decoding.tool_calls import ToolFormat
from oxillama.errors import OxiLlamaError, ParameterError
from oxillama.serving.async_engine import AsyncEngine
from oxillama.serving.async_session import AsyncSession
from oxillama.serving.http import session_routes, text_routes
from oxillama.serving.http import webui as webui_files
from oxillama.serving.http.access_log import RequestLog, note
from oxillama.serving.http.anthropic import errors as anthropic_errors
from oxillama.serving.http.anthropic import routes as anthropic_routes
from oxillama.serving.http.anthropic.schemas import definitions as anthropic_definitions
from oxillama.serving.http.api_error import ApiError, error_body, from_library_error
from oxillama.serving.http.auth import ApiKeys, AuthMiddleware
from oxillama.serving.http.embeddings_route import embeddings
from oxillama.serving.http.event_stream import EventStream, first_item, lease_closer
from oxillama.serving.http.harmony import HarmonyChoice
from oxillama.serving.http.json_body import parse_json_object
from oxillama.serving.http.latency_metrics import LatencyMetrics
from oxillama.serving.http.limits import BodyLimitMiddleware, Limits
from oxillama.serving.http.logprob_shapes import chat_logprobs, completion_logprobs
from oxillama.serving.http.merged import merged
from oxillama.serving.http.metrics import ServerCollector, exposition
from oxillama.serving.http.openapi import openapi_document
from oxillama.serving.http.raw_turn import RawTurn
from oxillama.serving.http.request_schemas import SESSION_ID, UNSUPPORTED, RequestSchemas
from oxillama.serving.http.rerank_route import rerank
from oxillama.serving.http.responses import (
    StoredResponses,
    create_response,
    delete_response,
    get_response,
    response_request,
)
from oxillama.serving.http.schema_check import SchemaViolation, check
from oxillama.serving.http.session_header import HEADER, with_session_header
from oxillama.serving.http.session_notes import SessionNotes
from oxillama.serving.http.session_table import Lease, SessionTable
from oxillama.serving.http.tools import ChoiceCalls, tool_request

__all__ = ["build_app"]

log = logging.getLogger("oxillama.server")

_SESSION_ID = re.compile(SESSION_ID.removeprefix("^").removesuffix("$"))

#: How a route runs one request: the whole completion, or its pieces.
Turn = tuple[Callable[..., Awaitable[Completion]], Callable[..., AsyncIterator[str]]]


@dataclass(frozen=True)
class Options:
    """What a generation request asks for, checked."""

    max_tokens: int
    kwargs: dict[str, Any]
    stream: bool
    include_usage: bool
    session: str | None
    #: OpenAI's ``n``: choices of one prompt.
    n: int = 1


def _longest_piece(engine: AsyncEngine) -> int:
    tok = engine.engine.tokenizer
    return max(1, max(len(tok.token_to_piece(i)) for i in range(engine.engine.vocab_size)))


def _message_text(m: dict[str, Any]) -> dict[str, Any]:
    """A chat message with array content (OpenAI's text parts) joined into
    the string the chat templates expect."""
    content = m.get("content")
    if isinstance(content, list):
        return {**m, "content": "".join(part["text"] for part in content)}
    return m


class Server:
    def __init__(
        self,
        engine: AsyncEngine,
        model_name: str,
        sessions_dir: Path | None,
        limits: Limits,
        *,
        auth: bool,
        metrics_auth: bool,
        tool_format: ToolFormat | None = None,
        routed_by_session_header: bool = False,
        reasoning_format: ReasoningFormat = "auto",
        reasoning_budget: int = -1,
        webui: bool = False,
        reranking: bool = False,
    ) -> None:
        check_reasoning(reasoning_format, reasoning_budget)
        if reranking and engine.engine.model.rank_head is None:
            raise ParameterError(
                "--reranking needs a reranker: a cross-encoder GGUF, a BERT with a "
                "classifier head (tensors cls.weight or cls.output.weight)"
            )
        #: ``--reranking``: /v1/rerank and /rerank score documents.
        self.reranking = reranking
        self.engine = engine
        self.tool_format = tool_format
        self.reasoning_budget = reasoning_budget
        # Whether replies are split into reasoning and content.
        self.splits_reasoning = reasoning_format == "deepseek" or (
            reasoning_format == "auto"
            and thinks(engine.engine.chat_template_source, engine.engine.tokenize)
        )
        # A harmony model's (gpt-oss) replies are split by channel instead.
        self.harmony = reasoning_format != "none" and speaks_harmony(
            engine.engine.chat_template_source
        )
        if self.harmony:
            self.splits_reasoning = False
        self.model_name = model_name
        self.limits = limits
        self.n_ctx = engine.engine.n_ctx
        self.vocab = engine.engine.vocab_size
        # No prompt longer than this could fit: every token covers at most
        # the characters of the longest token's text.
        chars = limits.max_prompt_chars or self.n_ctx * _longest_piece(engine)
        #: Under a context shift a prompt may fill the context.
        self.shifts = engine.engine.context_shift is not None
        self.schemas = RequestSchemas(self.n_ctx, self.vocab, limits, chars, self.shifts)
        self.defs = {
            **self.schemas.definitions(dim=int(engine.engine.config["n_embd"])),
            **anthropic_definitions(self.schemas),
        }
        self.defs["ResponseRequest"] = response_request(self.schemas)
        self.sessions = SessionTable(
            engine,
            max_sessions=limits.max_sessions,
            folder=sessions_dir,
            remembered_evictions=limits.remembered_evictions,
            persist_turns=limits.persist_turns,
            max_kv_bytes=limits.max_session_memory,
        )
        #: The stored responses' objects and conversations (their KV is
        #: in their sessions).
        self.responses = StoredResponses(sessions_dir)
        #: What clients keep beside each session (the chat page's titles
        #: and messages).
        self.notes = SessionNotes(sessions_dir)
        #: Every /metrics family, in one registry per app.
        self.registry = CollectorRegistry(auto_describe=True)
        self.latency = LatencyMetrics(engine.scheduler, self.registry)
        self.registry.register(ServerCollector(engine.metrics, self.sessions))
        #: Behind a router that routes sessions by X-Session-Id: the session
        #: requests it could not route (named in the body only).
        self.without_affinity = (
            Counter(
                "oxillama:session_requests_without_affinity",
                "Session requests that named their session in the body only, which the "
                "router sent where it sends requests without a session (the least loaded "
                "replica); a replica where the session is not live restores it from the "
                "sessions folder.",
                registry=self.registry,
            )
            if routed_by_session_header
            else None
        )
        #: Set on SIGTERM (serve.py): /ready answers 503 while the requests
        #: in flight finish.
        self.draining = False
        self.document = openapi_document(
            self.defs, model_name=model_name, auth=auth, metrics_auth=metrics_auth, webui=webui
        )

    # ------------------------------------------------------------- bodies

    async def body(self, request: Request, schema: str) -> dict[str, Any]:
        raw = await request.body()
        body = parse_json_object(raw, self.limits.max_json_depth)
        if "session" in self.defs[schema].get("properties", {}):
            body = with_session_header(request.headers, body)
        try:
            checked: dict[str, Any] = check(body, self.defs[schema], "", self.defs)
        except SchemaViolation as e:
            hint = UNSUPPORTED.get(e.param or "")
            if hint and e.path == e.param:
                e.message = f"{hint}; got '{e.param}': {json.dumps(body[e.param])[:40]}"
            raise
        model = checked.get("model")
        adapters = self.engine.loras
        if model is not None and model != self.model_name and model not in adapters:
            names = ", ".join(f"'{n}'" for n in [self.model_name, *adapters])
            raise ApiError(
                404,
                f"model '{model}' does not exist (this server has {names})",
                kind="not_found_error",
                param="model",
                code="model_not_found",
            )
        lora = checked.get("lora")
        if lora is not None and lora not in adapters:
            known = ", ".join(f"'{n}'" for n in adapters) or "none"
            raise ApiError(
                400,
                f"unknown LoRA adapter '{lora}' (this server has: {known})",
                param="lora",
                code="lora_not_found",
            )
        if model in adapters and lora is not None and lora != model:
            raise ApiError(
                400,
                f"'model' names the adapter '{model}' and 'lora' names '{lora}': pick one",
                param="lora",
            )
        if (
            self.without_affinity is not None
            and checked.get("session") is not None
            and HEADER not in request.headers
        ):
            self.without_affinity.inc()
        return checked

    def options(self, body: Mapping[str, Any]) -> Options:
        def get(key: str, default: Any) -> Any:
            v = body.get(key)
            return default if v is None else v

        max_tokens = get("max_tokens", get("max_completion_tokens", min(256, self.n_ctx)))
        bias: dict[str, float] = get("logit_bias", {})
        for k in bias:
            if int(k) >= self.vocab:
                raise ApiError(
                    400,
                    f"'logit_bias' key {k} is not a token id (the vocabulary has "
                    f"{self.vocab} tokens)",
                    param="logit_bias",
                )
        sampler = SamplerConfig(
            temperature=float(get("temperature", 1.0)),
            top_p=float(get("top_p", 1.0)),
            # Past the vocabulary a top-k keeps everything.
            top_k=min(int(get("top_k", 0)), self.vocab),
            min_p=float(get("min_p", 0.0)),
            repetition_penalty=float(get("repetition_penalty", 1.0)),
            frequency_penalty=float(get("frequency_penalty", 0.0)),
            presence_penalty=float(get("presence_penalty", 0.0)),
            mirostat=int(get("mirostat", 0)),
            # No seed: a fresh one per request, reported as `seed`.
            seed=None if body.get("seed") is None else int(body["seed"]) % 2**64,
            logit_bias={int(k): float(v) for k, v in bias.items()},
        )
        stop = get("stop", [])
        kwargs: dict[str, Any] = {
            "sampler": sampler,
            "stop": [stop] if isinstance(stop, str) else stop,
            "ignore_eos": bool(get("ignore_eos", False)),
            **self.constraint(body),
        }
        lora = body.get("lora") or (
            body.get("model") if body.get("model") in self.engine.loras else None
        )
        if lora is not None:
            if body.get("session") is not None:
                raise ApiError(
                    400,
                    "a stateful session request cannot pick a LoRA adapter",
                    param="lora" if body.get("lora") else "model",
                )
            kwargs["lora"] = lora
        logprobs = self.logprobs(body)
        if logprobs is not None:
            kwargs["logprobs"] = logprobs
        speculative = body.get("speculative")
        if speculative is not None:
            if body.get("session") is not None and speculative != "none":
                raise ApiError(
                    400,
                    "a stateful session request cannot use speculative decoding",
                    param="speculative",
                )
            if body.get("session") is None:
                kwargs["speculative"] = speculative
        stream_options = get("stream_options", {})
        n = int(get("n", 1))
        if n > 1 and body.get("session") is not None:
            raise ApiError(400, "n > 1 cannot continue a stateful session", param="n")
        return Options(
            max_tokens=int(max_tokens),
            kwargs=kwargs,
            stream=bool(get("stream", False)),
            include_usage=bool(stream_options.get("include_usage")),
            session=body.get("session"),
            n=n,
        )

    @staticmethod
    def logprobs(body: Mapping[str, Any]) -> int | None:
        """The ``k`` of top alternatives, or None: completions take
        ``logprobs: k``; chat takes ``logprobs: true`` with ``top_logprobs: k``."""
        lp, top = body.get("logprobs"), body.get("top_logprobs")
        if isinstance(lp, bool) or (lp is None and top is not None):
            if top is not None and lp is not True:
                raise ApiError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")
            return (top or 0) if lp else None
        return None if lp is None else int(lp)

    def constraint(self, body: Mapping[str, Any]) -> dict[str, Any]:
        grammar = body.get("grammar")
        fmt = body.get("response_format")
        if fmt is None or fmt["type"] == "text":
            return {"grammar": grammar}
        kind = fmt["type"]
        if grammar is not None:
            raise ApiError(400, "pass grammar or response_format, not both", param="grammar")
        if kind == "json_object":
            # Any JSON object: the schema compiler already writes that grammar.
            return {"json_schema": {"type": "object"}}
        return {"json_schema": fmt["json_schema"]["schema"]}

    def prompt_tokens(self, prompt: str | list[Any]) -> list[int]:
        if isinstance(prompt, list) and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.engine.tokenize(prompt)
        return [int(t) for t in prompt]

    def check_fits(self, n_prompt: int) -> None:
        if self.shifts and n_prompt > self.n_ctx:
            raise ApiError(
                400,
                f"the prompt has {n_prompt} tokens but the context size is {self.n_ctx} "
                "tokens (a context shift makes room for generated tokens, not for a "
                "longer prompt)",
                param="prompt",
                code="context_length_exceeded",
            )
        if not self.shifts and n_prompt >= self.n_ctx:
            raise ApiError(
                400,
                f"the prompt has {n_prompt} tokens but the context size is {self.n_ctx} "
                "tokens (at least one must be left to generate; serve --context-shift "
                "lets a prompt fill it)",
                param="prompt",
                code="context_length_exceeded",
            )

    # ---------------------------------------------------------- generation

    async def run(
        self,
        tokens: list[int],
        opts: Options,
        shape: Callable[[int, str, Completion | None, str | None], dict[str, Any]],
        final: Callable[[list[Completion]], dict[str, Any]],
        stateful: Callable[[AsyncSession], Turn],
        record: dict[str, Any],
    ) -> Response:
        """Answers one generation request; ``record`` (the access log's)
        gets the session and the token counts."""
        record["prompt_tokens"] = len(tokens)
        if opts.session is not None:
            record["session"] = opts.session
        final = _counting(final, record)
        lease: Lease | None = None
        if opts.session is not None:
            lease = await self.sessions.lease(opts.session)
        # The stream's end releases the lease once the response owns it.
        handed_over = False
        results: list[list[Completion]] = [[] for _ in range(opts.n)]
        try:
            if lease is not None:
                # A session turn: the session appends what it has not seen.
                generate, stream = stateful(lease.session)
                if not opts.stream:
                    out = await generate(opts.max_tokens, **opts.kwargs)
                    await lease.persist()
                    return JSONResponse(final([out]))
                streams: Sequence[AsyncIterator[str]] = [
                    stream(opts.max_tokens, result=results[0], **opts.kwargs)
                ]
            elif not opts.stream:
                if opts.n == 1:
                    one = await self.engine.generate(tokens, opts.max_tokens, **opts.kwargs)
                    return JSONResponse(final([one]))
                outs = await self.engine.generate_n(tokens, opts.n, opts.max_tokens, **opts.kwargs)
                return JSONResponse(final(outs))
            elif opts.n == 1:
                streams = [
                    self.engine.stream(tokens, opts.max_tokens, result=results[0], **opts.kwargs)
                ]
            else:
                streams = self.engine.stream_n(
                    tokens, opts.n, opts.max_tokens, results=results, **opts.kwargs
                )
            events_in = merged(streams) if len(streams) > 1 else _single(streams[0])
            first = await first_item(events_in)
            handed_over = True
        finally:
            if lease is not None and not handed_over:
                lease.release()

        close = lease_closer(events_in, lease)

        async def events() -> AsyncIterator[bytes]:
            # Leaving this generator (client gone) closes the streams, which
            # cancels their requests in the scheduler.
            try:
                item = first
                while item is not None:
                    i, piece = item
                    if piece is not None:
                        yield _sse(shape(i, piece, None, None))
                    else:
                        done = results[i][0] if results[i] else None
                        yield _sse(shape(i, "", done, _finish(done)))
                    item = await anext(events_in, None)
                if lease is not None:
                    await lease.persist()
                record["completion_tokens"] = sum(len(r[0].tokens) for r in results if r)
                if opts.include_usage:
                    usage = shape(0, "", None, None)
                    usage["choices"] = []
                    usage["usage"] = _usage(len(tokens), [r[0] for r in results if r])
                    yield _sse(usage)
            except OxiLlamaError as e:
                err = from_library_error(e)
                yield _sse(error_body(err.message, err.kind, err.param, err.code))
            except Exception:
                log.exception("a streamed generation failed")
                yield _sse(error_body("internal server error", "server_error"))
            else:
                yield b"data: [DONE]\n\n"
            finally:
                await close()

        return EventStream(events(), close)

    # ------------------------------------------------------------- routes

    async def completions(self, request: Request) -> Response:
        body = await self.body(request, "CompletionRequest")
        opts = self.options(body)
        served = opts.kwargs.get("lora") or self.model_name
        prompt = body["prompt"]
        tokens = self.prompt_tokens(prompt)
        self.check_fits(len(tokens))
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

        want_lp = "logprobs" in opts.kwargs
        tok = self.engine.engine.tokenizer
        offsets = [0] * opts.n

        def shape(i: int, text: str, done: Completion | None, finish: str | None) -> dict[str, Any]:
            lp = None
            if want_lp and finish is None:
                lp = completion_logprobs(getattr(text, "logprobs", ()), tok, offsets[i])
                offsets[i] += len(text)
            return {
                "id": cid,
                "object": "text_completion",
                "created": created,
                "model": served,
                "choices": [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish}],
                **_seed(done),
            }

        def final(outs: list[Completion]) -> dict[str, Any]:
            return {
                "id": cid,
                "object": "text_completion",
                "created": created,
                "model": served,
                "choices": [
                    {
                        "index": i,
                        "text": out.text,
                        "logprobs": completion_logprobs(out.logprobs, tok)
                        if out.logprobs is not None
                        else None,
                        "finish_reason": _finish(out),
                    }
                    for i, out in enumerate(outs)
                ],
                "usage": _usage(len(tokens), outs),
                **_seed(outs[0]),
            }

        # A session appends the prompt to its context (BOS only at the start).
        p = prompt[0] if isinstance(prompt, list) and isinstance(prompt[0], str) else prompt

        def stateful(sess: AsyncSession) -> Turn:
            return (
                lambda n, **kw: sess.generate(p, n, **kw),
                lambda n, **kw: sess.stream(p, n, **kw),
            )

        return await self.run(tokens, opts, shape, final, stateful, note(request.state))

    async def chat(self, request: Request) -> Response:
        body = await self.body(request, "ChatCompletionRequest")
        opts = self.options(body)
        served = opts.kwargs.get("lora") or self.model_name
        messages = [_message_text(m) for m in body["messages"]]
        chars = sum(len(m["content"]) for m in messages if isinstance(m.get("content"), str))
        if chars > self.schemas.prompt_chars:
            raise ApiError(
                400,
                f"the messages hold {chars} characters; at most "
                f"{self.schemas.prompt_chars} could fit the context",
                param="messages",
                code="context_length_exceeded",
            )
        template = self.engine.engine.chat_template_source
        treq = tool_request(body, template, self.tool_format)
        variables: dict[str, Any] = dict(body.get("chat_template_kwargs") or {})
        if self.reasoning_budget == 0:
            # Thinking off where the template has the switch (Qwen3's).
            variables.setdefault("enable_thinking", False)
        if treq is not None:
            if self.harmony and treq.constrained:
                raise ApiError(
                    400,
                    "a required, named or strict tool call runs under a grammar in the "
                    "model's call syntax, which harmony (gpt-oss) replies do not have yet: "
                    "use tool_choice 'auto' without strict tools",
                    param="tool_choice",
                )
            if treq.constrained and (
                opts.kwargs.get("grammar") is not None or "json_schema" in opts.kwargs
            ):
                raise ApiError(
                    400,
                    "a required or strict tool call has its own grammar: drop grammar "
                    "and response_format, or use non-strict tools with tool_choice 'auto'",
                    param="tool_choice",
                )
            opts.kwargs.update(treq.grammar_kwargs())
            messages, tool_vars = treq.template_input(messages)
            variables.update(tool_vars)
        text = self.engine.engine.apply_chat_template(messages, **variables)
        inside = opens_reasoning(text)
        split = [
            ReasoningSplitter(inside=inside) if self.splits_reasoning else None
            for _ in range(opts.n)
        ]
        tokens = self.engine.tokenize(text)
        self.check_fits(len(tokens))
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        want_lp = "logprobs" in opts.kwargs
        tok = self.engine.engine.tokenizer
        harmony = [HarmonyChoice() for _ in range(opts.n)] if self.harmony else []
        found = (
            [ChoiceCalls(treq.fmt) for _ in range(opts.n)]
            if treq is not None and not harmony
            else []
        )

        def finish_of(i: int, finish: str | None) -> str | None:
            # A reply cut by max_tokens says so, calls or not.
            calls = (found and found[i].calls) or (harmony and harmony[i].calls)
            if finish == "stop" and calls:
                return "tool_calls"
            return finish

        def shape(
            i: int, piece: str, done: Completion | None, finish: str | None
        ) -> dict[str, Any]:
            reasoning = ""
            sp = split[i]
            if sp is not None:
                reasoning, piece = sp.feed(piece) if finish is None else sp.finish()
            if harmony:
                h = harmony[i]
                delta = h.delta(piece) if finish is None else h.end(piece)
            elif found:
                if finish is None:
                    delta = found[i].delta(piece)
                else:
                    # What the splitter held back, then the detector's end.
                    delta = found[i].delta(piece) if piece else {}
                    end = found[i].end()
                    for k, v in end.items():
                        delta[k] = delta[k] + v if k in delta and k != "role" else v
            else:
                delta = {"content": piece} if piece or finish is None else {}
            if reasoning:
                delta = {"reasoning_content": reasoning, **delta}
            finish = finish_of(i, finish)
            choice: dict[str, Any] = {"index": i, "delta": delta, "finish_reason": finish}
            if want_lp:
                lps = getattr(piece, "logprobs", ())
                choice["logprobs"] = chat_logprobs(lps, tok) if lps else None
            return {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": served,
                "choices": [choice],
                **_seed(done),
            }

        def message(i: int, out: Completion) -> dict[str, Any]:
            if harmony:
                return harmony[i].message(out.text)
            reasoning, text = (
                split_reasoning(out.text, inside=inside)
                if self.splits_reasoning
                else (None, out.text)
            )
            msg = found[i].message(text) if found else {"role": "assistant", "content": text}
            if reasoning:
                msg["reasoning_content"] = reasoning
            return msg

        def final(outs: list[Completion]) -> dict[str, Any]:
            return {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": served,
                "choices": [
                    {
                        "index": i,
                        "message": message(i, out),
                        "logprobs": chat_logprobs(out.logprobs, tok)
                        if out.logprobs is not None
                        else None,
                        "finish_reason": finish_of(i, _finish(out)),
                    }
                    for i, out in enumerate(outs)
                ],
                "usage": _usage(len(tokens), outs),
                **_seed(outs[0]),
            }

        def stateful(sess: AsyncSession) -> Turn:
            # Only the turns the session has not seen are evaluated; the
            # reply comes raw, as a one-shot request's, for shape() to split.
            turn = RawTurn(self.engine, sess, messages, tokens, variables)
            return turn.complete, turn.stream

        return await self.run(tokens, opts, shape, final, stateful, note(request.state))

    def session_id(self, request: Request) -> str:
        sid = str(request.path_params["sid"])
        if not _session_id_ok(sid):
            raise ApiError(400, "session ids are 1-64 characters of A-Z a-z 0-9 _ -", param="sid")
        return sid

    def snapshot_path(self, sid: str) -> Path:
        path = self.sessions.path(sid)
        if path is None:
            raise ApiError(400, "this server has no sessions folder (start it with --sessions-dir)")
        return path

    async def save(self, request: Request) -> Response:
        sid = self.session_id(request)
        path = self.snapshot_path(sid)
        tokens = await self.sessions.save(sid)
        return JSONResponse({"id": sid, "tokens": tokens, "path": path.name})

    async def restore(self, request: Request) -> Response:
        sid = self.session_id(request)
        self.snapshot_path(sid)
        sess = await self.sessions.replace_from_file(sid)
        return JSONResponse({"id": sid, "tokens": sess.n_past})

    async def list_sessions(self, request: Request) -> Response:
        return await session_routes.list_sessions(self, request)

    async def session(self, request: Request) -> Response:
        if request.method == "PUT":
            return await session_routes.put_session(self, request)
        if request.method == "DELETE":
            return await session_routes.delete_session(self, request)
        return await session_routes.get_session(self, request)

    async def fork(self, request: Request) -> Response:
        return await session_routes.fork_session(self, request)

    async def snapshot(self, request: Request) -> Response:
        if request.method == "PUT":
            return await session_routes.import_snapshot(self, request)
        return await session_routes.export_snapshot(self, request)

    async def info(self, request: Request) -> Response:
        return await session_routes.info(self, request)

    async def embeddings(self, request: Request) -> Response:
        return await embeddings(self, request)

    async def rerank(self, request: Request) -> Response:
        return await rerank(self, request)

    async def messages(self, request: Request) -> Response:
        return await anthropic_routes.messages(self, request)

    async def count_tokens(self, request: Request) -> Response:
        return await anthropic_routes.count_tokens(self, request)

    async def tokenize(self, request: Request) -> Response:
        return await text_routes.tokenize(self, request)

    async def detokenize(self, request: Request) -> Response:
        return await text_routes.detokenize(self, request)

    async def apply_template(self, request: Request) -> Response:
        return await text_routes.apply_template(self, request)

    async def responses_create(self, request: Request) -> Response:
        return await create_response(self, request)

    async def response(self, request: Request) -> Response:
        if request.method == "DELETE":
            return await delete_response(self, request)
        return await get_response(self, request)

    async def models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": name, "object": "model", "created": 0, "owned_by": "oxillama"}
                    for name in [self.model_name, *self.engine.loras]
                ],
            }
        )

    async def health(self, request: Request) -> Response:
        """Liveness: the process answers (also while it drains)."""
        return JSONResponse({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        """Readiness: a load balancer should send requests here."""
        if self.draining:
            raise ApiError(503, "the server is draining", kind="server_error", code="draining")
        return JSONResponse({"status": "ready"})

    async def drain(self) -> None:
        """The end of a graceful stop, after the requests in flight: every
        live session goes to the sessions folder (where the next server, or
        another replica, picks it up)."""
        self.draining = True
        saved = await self.sessions.save_all()
        if saved:
            log.info("drained: %d live session(s) saved to %s", saved, self.sessions.folder)
        store = self.engine.kv_store
        if store is not None:
            # Finished requests' blocks still queued reach the store.
            await asyncio.get_running_loop().run_in_executor(None, store.flush)

    def metrics_exposition(self) -> bytes:
        """What ``/metrics`` answers: every family of this app's registry in
        Prometheus' text format (``prometheus_client.CONTENT_TYPE_LATEST``),
        for serving on another port too."""
        return exposition(self.registry)

    async def metrics(self, request: Request) -> Response:
        return Response(self.metrics_exposition(), media_type=CONTENT_TYPE_LATEST)

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(self.document)


@contextlib.asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    yield
    # Shutdown: uvicorn has let the requests in flight finish (up to its
    # graceful-shutdown deadline).
    server: Server = app.state.server
    await server.drain()


def _counting(
    final: Callable[[list[Completion]], dict[str, Any]], record: dict[str, Any]
) -> Callable[[list[Completion]], dict[str, Any]]:
    """``final`` that also notes the completion tokens for the access log."""

    def counted(outs: list[Completion]) -> dict[str, Any]:
        record["completion_tokens"] = sum(len(o.tokens) for o in outs)
        return final(outs)

    return counted


async def _single(stream: AsyncIterator[str]) -> AsyncGenerator[tuple[int, str | None]]:
    """One choice's stream as merged() events, without its tasks."""
    try:
        async for piece in stream:
            yield 0, piece
        yield 0, None
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


def _session_id_ok(sid: str) -> bool:
    return _SESSION_ID.fullmatch(sid) is not None


def _finish(out: Completion | None) -> str:
    # OpenAI has no "eos": the model ending its turn is a "stop" there.
    return "length" if out is not None and out.finish_reason == "length" else "stop"


def _sse(obj: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _seed(out: Completion | None) -> dict[str, int]:
    """The sampler's seed on a finished response (not an OpenAI field; a
    request without one gets a fresh seed, and this repeats it)."""
    return {} if out is None or out.seed is None else {"seed": out.seed}


def _usage(prompt: int, outs: list[Completion]) -> dict[str, int]:
    """Usage over every choice (the prompt is counted once, as OpenAI does)."""
    n = sum(len(o.tokens) for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}


def _guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[..., Any]:
    """The route answering every error with OpenAI's error object: a 4xx
    for anything about the request (every ``OxiLlamaError`` included), a
    logged 500 with a generic message for anything else."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as e:
            return e.response()
        except OxiLlamaError as e:
            return from_library_error(e).response()
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return ApiError(500, "internal server error", kind="server_error").response()

    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    err = ApiError(exc.status_code, str(exc.detail), kind=kind, headers=exc.headers)
    return anthropic_errors.for_path(request.url.path, err)


def build_app(
    engine: AsyncEngine,
    *,
    model_name: str = "oxillama",
    sessions_dir: str | os.PathLike[str] | None = None,
    api_keys: Iterable[str] = (),
    metrics_auth: bool = False,
    limits: Limits | None = None,
    tool_format: ToolFormat | None = None,
    routed_by_session_header: bool = False,
    reasoning_format: ReasoningFormat = "auto",
    reasoning_budget: int = -1,
    webui: bool = True,
    reranking: bool = False,
) -> Starlette:
    """The Starlette app serving ``engine``.

    ``sessions_dir`` is where ``/v1/sessions/{id}/save`` and ``.../restore``
    keep snapshots and where idle sessions past ``limits.max_sessions`` are
    hibernated (replicas sharing it can hand sessions to each other).
    With ``api_keys``, every ``/v1/*`` route, the text tools
    (``/tokenize``, ``/detokenize``, ``/apply-template``), ``/rerank`` and, with
    ``metrics_auth``, ``/metrics`` require ``Authorization: Bearer <key>``
    (or Anthropic's ``x-api-key: <key>``). ``limits``
    bounds what one request may ask for (:class:`Limits`). ``tool_format``
    overrides the tool-call syntax read from the chat template. A session
    is named by the body's ``session`` or the ``X-Session-Id`` header; with
    ``routed_by_session_header`` (behind a router that routes by it),
    ``oxillama:session_requests_without_affinity_total`` counts the
    session requests named in the body only. ``webui`` serves the chat
    page at ``/``. ``reranking`` (a reranker model only) serves
    ``/v1/rerank`` and ``/rerank``; without it they answer 501."""
    limits = limits or Limits()
    folder = Path(sessions_dir) if sessions_dir is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    keys = ApiKeys(api_keys)
    s = Server(
        engine,
        model_name,
        folder,
        limits,
        auth=bool(keys),
        metrics_auth=metrics_auth,
        tool_format=tool_format,
        routed_by_session_header=routed_by_session_header,
        reasoning_format=reasoning_format,
        reasoning_budget=reasoning_budget,
        webui=webui,
        reranking=reranking,
    )
    routes = [
        Route("/health", _guarded(s.health), methods=["GET"]),
        Route("/ready", _guarded(s.ready), methods=["GET"]),
        Route("/metrics", _guarded(s.metrics), methods=["GET"]),
        Route("/openapi.json", _guarded(s.openapi), methods=["GET"]),
        Route("/v1/models", _guarded(s.models), methods=["GET"]),
        Route("/v1/completions", _guarded(s.completions), methods=["POST"]),
        Route("/v1/chat/completions", _guarded(s.chat), methods=["POST"]),
        Route("/v1/embeddings", _guarded(s.embeddings), methods=["POST"]),
        Route("/v1/rerank", _guarded(s.rerank), methods=["POST"]),
        Route("/rerank", _guarded(s.rerank), methods=["POST"]),
        Route("/v1/messages", anthropic_errors.guarded(s.messages), methods=["POST"]),
        Route(
            "/v1/messages/count_tokens",
            anthropic_errors.guarded(s.count_tokens),
            methods=["POST"],
        ),
        Route("/v1/responses", _guarded(s.responses_create), methods=["POST"]),
        Route("/v1/responses/{rid}", _guarded(s.response), methods=["GET", "DELETE"]),
        Route("/tokenize", _guarded(s.tokenize), methods=["POST"]),
        Route("/detokenize", _guarded(s.detokenize), methods=["POST"]),
        Route("/apply-template", _guarded(s.apply_template), methods=["POST"]),
        Route("/v1/sessions/{sid}/save", _guarded(s.save), methods=["POST"]),
        Route("/v1/sessions/{sid}/restore", _guarded(s.restore), methods=["POST"]),
        Route("/v1/sessions", _guarded(s.list_sessions), methods=["GET"]),
        Route("/v1/sessions/{sid}", _guarded(s.session), methods=["GET", "PUT", "DELETE"]),
        Route("/v1/sessions/{sid}/fork", _guarded(s.fork), methods=["POST"]),
        Route("/v1/sessions/{sid}/snapshot", _guarded(s.snapshot), methods=["GET", "PUT"]),
        Route("/v1/info", _guarded(s.info), methods=["GET"]),
    ]
    if webui:
        routes += [
            Route("/", _guarded(webui_files.index), methods=["GET"]),
            Route("/webui/{name}", _guarded(webui_files.static), methods=["GET"]),
        ]
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(RequestLog, count=s.latency.count_request),
            Middleware(AuthMiddleware, keys=keys, metrics_auth=metrics_auth),
            Middleware(BodyLimitMiddleware, limit=limits.max_body_bytes),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=_lifespan,
    )
    app.state.server = s
    return app
