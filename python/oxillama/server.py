"""An OpenAI-compatible HTTP server over :class:`~oxillama.AsyncEngine`.

Routes: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (both with ``stream: true`` over SSE) and
``GET /metrics`` (Prometheus text). Sampling fields beyond OpenAI's are
accepted in the body as vLLM and llama-server accept them: ``top_k``,
``min_p``, ``repetition_penalty``, ``mirostat``, ``ignore_eos``,
``grammar``. ``response_format`` takes ``json_schema`` and ``json_object``.
Errors use OpenAI's error object and status codes. A client that
disconnects cancels its generation.

Needs ``pip install oxillama[server]`` (Starlette and uvicorn).
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .async_engine import AsyncEngine
from .async_session import AsyncSession
from .completion import Completion
from .errors import GenerateError, GrammarError, OxiLlamaError, ParameterError
from .sampling import SamplerConfig
from .snapshot import SnapshotError

__all__ = ["build_app", "serve"]


class ApiError(Exception):
    """An error answered with OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def response(self) -> JSONResponse:
        headers = {"Retry-After": "1"} if self.status == 503 else None
        body = {
            "error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}
        }
        return JSONResponse(body, status_code=self.status, headers=headers)


def _field(body: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    v = body.get(key, default)
    if v is None:
        return default
    if (
        isinstance(v, bool)
        and kind is not bool
        and bool not in (kind if isinstance(kind, tuple) else (kind,))
    ):
        raise ApiError(400, f"'{key}' must be a {getattr(kind, '__name__', kind)}", param=key)
    if not isinstance(v, kind):
        raise ApiError(400, f"'{key}' has the wrong type ({type(v).__name__})", param=key)
    return v


def _sampler(body: Mapping[str, Any]) -> SamplerConfig:
    num = (int, float)
    try:
        bias = _field(body, "logit_bias", dict, {})
        return SamplerConfig(
            temperature=float(_field(body, "temperature", num, 1.0)),
            top_p=float(_field(body, "top_p", num, 1.0)),
            top_k=int(_field(body, "top_k", int, 0)),
            min_p=float(_field(body, "min_p", num, 0.0)),
            repetition_penalty=float(_field(body, "repetition_penalty", num, 1.0)),
            mirostat=int(_field(body, "mirostat", int, 0)),
            seed=int(_field(body, "seed", int, 0)) % 2**64,
            logit_bias={int(k): float(v) for k, v in bias.items()},
        )
    except (ParameterError, ValueError, TypeError) as e:
        raise ApiError(400, str(e)) from None


_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")

#: How a route runs one request: the whole completion, or its pieces.
Turn = tuple[Callable[..., Awaitable[Completion]], Callable[..., AsyncIterator[str]]]


class Server:
    def __init__(
        self, engine: AsyncEngine, model_name: str, sessions_dir: Path | None = None
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.sessions_dir = sessions_dir
        #: Stateful sessions by id. A request naming a session continues its
        #: context instead of starting a new one; its turns batch with every
        #: other request and its KV stays in the shared pool between turns.
        self.sessions: dict[str, AsyncSession] = {}

    def session_id(self, request: Request) -> str:
        sid = str(request.path_params["sid"])
        if not _SESSION_ID.fullmatch(sid):
            raise ApiError(400, "session ids are 1-64 characters of A-Z a-z 0-9 _ -")
        return sid

    def session(self, sid: str) -> AsyncSession:
        sess = self.sessions.get(sid)
        if sess is None or sess.closed:
            sess = self.sessions[sid] = self.engine.session()
        return sess

    def snapshot_path(self, sid: str) -> Path:
        if self.sessions_dir is None:
            raise ApiError(400, "this server has no sessions folder (start it with --sessions-dir)")
        return self.sessions_dir / f"{sid}.oxisnap"

    async def save(self, request: Request) -> Response:
        sid = self.session_id(request)
        path = self.snapshot_path(sid)
        if sid not in self.sessions:
            raise ApiError(404, f"no session '{sid}' on this replica", kind="not_found_error")
        sess = self.sessions[sid]
        await sess.snapshot(path)
        return JSONResponse({"id": sid, "tokens": sess.n_past, "path": path.name})

    async def restore(self, request: Request) -> Response:
        sid = self.session_id(request)
        path = self.snapshot_path(sid)
        if not path.is_file():
            raise ApiError(404, f"no saved session '{sid}'", kind="not_found_error")
        try:
            sess = await self.engine.restore_session(path)
        except SnapshotError as e:
            raise ApiError(400, f"cannot restore session '{sid}': {e}") from None
        old = self.sessions.get(sid)
        self.sessions[sid] = sess
        if old is not None:
            await old.close()
        return JSONResponse({"id": sid, "tokens": sess.n_past})

    async def body(self, request: Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise ApiError(
                404,
                f"model '{model}' does not exist (this server has '{self.model_name}')",
                kind="not_found_error",
                param="model",
            )
        return body

    def constraint(self, body: Mapping[str, Any]) -> dict[str, Any]:
        grammar = _field(body, "grammar", str, None)
        fmt = _field(body, "response_format", dict, None)
        if fmt is None:
            return {"grammar": grammar}
        kind = fmt.get("type")
        if kind == "text":
            return {"grammar": grammar}
        if grammar is not None:
            raise ApiError(400, "pass grammar or response_format, not both", param="grammar")
        if kind == "json_object":
            # Any JSON object: the schema compiler already writes that grammar.
            return {"json_schema": {"type": "object"}}
        if kind == "json_schema":
            spec = fmt.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise ApiError(
                    400,
                    "response_format.json_schema.schema must be an object",
                    param="response_format",
                )
            return {"json_schema": schema}
        raise ApiError(400, f"unknown response_format type {kind!r}", param="response_format")

    def prompt_tokens(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.engine.tokenize(prompt)
        if isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            return list(prompt)
        raise ApiError(400, "'prompt' must be a string or a list of token ids", param="prompt")

    def check_fits(self, n_prompt: int, max_tokens: int) -> None:
        n_ctx = self.engine.engine.n_ctx
        if n_prompt >= n_ctx:
            raise ApiError(
                400,
                f"the prompt has {n_prompt} tokens but the context size is {n_ctx} tokens",
                param="prompt",
            )

    async def run(
        self,
        request: Request,
        tokens: list[int],
        body: Mapping[str, Any],
        shape: Callable[[str, Completion | None, str | None], dict[str, Any]],
        final: Callable[[Completion], dict[str, Any]],
        stateful: Callable[[AsyncSession], Turn],
    ) -> Response:
        max_tokens = _field(body, "max_tokens", int, None)
        if max_tokens is None:
            max_tokens = _field(body, "max_completion_tokens", int, 256)
        if max_tokens < 0:
            raise ApiError(400, "'max_tokens' must be non-negative", param="max_tokens")
        self.check_fits(len(tokens), max_tokens)
        stop = _field(body, "stop", (str, list), [])
        stop = [stop] if isinstance(stop, str) else stop
        if not all(isinstance(s, str) for s in stop):
            raise ApiError(400, "'stop' must be a string or a list of strings", param="stop")
        kwargs: dict[str, Any] = {
            "sampler": _sampler(body),
            "stop": stop,
            "ignore_eos": bool(_field(body, "ignore_eos", bool, False)),
            **self.constraint(body),
        }
        sid = _field(body, "session", str, None)
        if sid is not None and not _SESSION_ID.fullmatch(sid):
            raise ApiError(400, "session ids are 1-64 characters of A-Z a-z 0-9 _ -")
        streaming = bool(_field(body, "stream", bool, False))
        if sid is not None:
            # A session turn: the session appends what it has not seen.
            generate, stream = stateful(self.session(sid))
        else:

            def generate(n: int, **kw: Any) -> Awaitable[Completion]:
                return self.engine.generate(tokens, n, **kw)

            def stream(n: int, **kw: Any) -> AsyncIterator[str]:
                return self.engine.stream(tokens, n, **kw)

        if not streaming:
            try:
                out = await generate(max_tokens, **kwargs)
            except GrammarError as e:
                raise ApiError(400, str(e), param="grammar") from None
            return JSONResponse(final(out))
        result: list[Completion] = []
        try:
            pieces = stream(max_tokens, result=result, **kwargs)
            first = await anext(pieces, None)
        except GrammarError as e:
            raise ApiError(400, str(e), param="grammar") from None

        async def events() -> AsyncIterator[bytes]:
            # Leaving this generator (client gone) closes `pieces`, which
            # cancels the request in the scheduler.
            try:
                if first is not None:
                    yield _sse(shape(first, None, None))
                    async for piece in pieces:
                        yield _sse(shape(piece, None, None))
                done = result[0] if result else None
                yield _sse(shape("", done, done.finish_reason if done else "stop"))
                yield b"data: [DONE]\n\n"
            finally:
                await pieces.aclose()  # type: ignore[attr-defined]

        return StreamingResponse(events(), media_type="text/event-stream")

    # ------------------------------------------------------------ routes

    async def completions(self, request: Request) -> Response:
        body = await self.body(request)
        if "prompt" not in body:
            raise ApiError(400, "'prompt' is required", param="prompt")
        tokens = self.prompt_tokens(body["prompt"])
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

        def shape(text: str, done: Completion | None, finish: str | None) -> dict[str, Any]:
            return {
                "id": cid,
                "object": "text_completion",
                "created": created,
                "model": self.model_name,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            }

        def final(out: Completion) -> dict[str, Any]:
            d = shape(out.text, out, out.finish_reason)
            d["usage"] = _usage(len(tokens), out)
            return d

        prompt = body["prompt"]
        # A session appends the prompt to its context (BOS only at the start).
        p = prompt[0] if isinstance(prompt, list) and len(prompt) == 1 else prompt

        def stateful(sess: AsyncSession) -> Turn:
            return (
                lambda n, **kw: sess.generate(p, n, **kw),
                lambda n, **kw: sess.stream(p, n, **kw),
            )

        return await self.run(request, tokens, body, shape, final, stateful)

    async def chat(self, request: Request) -> Response:
        body = await self.body(request)
        messages = body.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
        ):
            raise ApiError(
                400, "'messages' must be a non-empty list of {role, content}", param="messages"
            )
        try:
            text = self.engine.engine.apply_chat_template(messages)
        except OxiLlamaError as e:
            raise ApiError(400, str(e), param="messages") from None
        tokens = self.engine.tokenize(text)
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def shape(piece: str, done: Completion | None, finish: str | None) -> dict[str, Any]:
            delta: dict[str, Any] = {"content": piece} if piece or finish is None else {}
            return {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model_name,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        def final(out: Completion) -> dict[str, Any]:
            return {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": self.model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": out.text},
                        "finish_reason": out.finish_reason,
                    }
                ],
                "usage": _usage(len(tokens), out),
            }

        def stateful(sess: AsyncSession) -> Turn:
            # Only the turns the session has not seen are evaluated.
            return (
                lambda n, **kw: sess.chat(messages, n, **kw),
                lambda n, **kw: sess.chat_stream(messages, n, **kw),
            )

        return await self.run(request, tokens, body, shape, final, stateful)

    async def models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": self.model_name, "object": "model", "created": 0, "owned_by": "oxillama"}
                ],
            }
        )

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(self, request: Request) -> Response:
        lines = []
        for k, v in self.engine.metrics().items():
            name = f"oxillama_{k}"
            lines.append(f"# TYPE {name} gauge")
            lines.append(f"{name} {float(v)}")
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _usage(prompt: int, out: Completion) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": len(out.tokens),
        "total_tokens": prompt + len(out.tokens),
    }


def build_app(
    engine: AsyncEngine,
    *,
    model_name: str = "oxillama",
    sessions_dir: str | os.PathLike[str] | None = None,
) -> Starlette:
    """The Starlette app serving ``engine``; ``sessions_dir`` is where
    ``/v1/sessions/{id}/save`` and ``.../restore`` keep snapshots (replicas
    sharing it can hand sessions to each other)."""
    folder = Path(sessions_dir) if sessions_dir is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    s = Server(engine, model_name, folder)

    def wrap(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                response: Response = await handler(request)
                return response
            except ApiError as e:
                return e.response()
            except GenerateError as e:
                msg = str(e)
                if "overloaded" in msg:
                    return ApiError(503, msg, kind="server_error").response()
                return ApiError(400, msg).response()
            except (ParameterError, GrammarError) as e:
                return ApiError(400, str(e)).response()

        return endpoint

    return Starlette(
        routes=[
            Route("/health", wrap(s.health), methods=["GET"]),
            Route("/metrics", wrap(s.metrics), methods=["GET"]),
            Route("/v1/models", wrap(s.models), methods=["GET"]),
            Route("/v1/completions", wrap(s.completions), methods=["POST"]),
            Route("/v1/chat/completions", wrap(s.chat), methods=["POST"]),
            Route("/v1/sessions/{sid}/save", wrap(s.save), methods=["POST"]),
            Route("/v1/sessions/{sid}/restore", wrap(s.restore), methods=["POST"]),
        ]
    )


def serve(
    model: str | None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    threads: int | None = None,
    context_size: int = 2048,
    max_batch: int = 8,
    kv_pages: int | None = None,
    model_name: str | None = None,
    sessions_dir: str | os.PathLike[str] | None = None,
) -> None:
    """Runs the server until interrupted."""
    import uvicorn

    engine = AsyncEngine(
        model,
        context_size=context_size,
        threads=threads,
        max_batch=max_batch,
        kv_pages=kv_pages,
    )
    name = model_name or (engine.engine.model_path.stem if engine.engine.model_path else "oxillama")
    app = build_app(engine, model_name=name, sessions_dir=sessions_dir)
    uvicorn.run(app, host=host, port=port, log_level="info")
