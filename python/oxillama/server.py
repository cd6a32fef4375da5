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

import asyncio
import contextlib
import json
import os
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .async_engine import AsyncEngine
from .completion import Completion
from .engine import Engine
from .grammar import constraint as _constraint
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


class Server:
    def __init__(
        self, engine: AsyncEngine, model_name: str, sessions_dir: Path | None = None
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.sessions_dir = sessions_dir
        #: Stateful sessions: id -> (engine, lock). A request naming a
        #: session continues its context instead of starting a new one.
        self.sessions: dict[str, tuple[Engine, asyncio.Lock]] = {}

    def session_id(self, request: Request) -> str:
        sid = str(request.path_params["sid"])
        if not _SESSION_ID.fullmatch(sid):
            raise ApiError(400, "session ids are 1-64 characters of A-Z a-z 0-9 _ -")
        return sid

    def session(self, sid: str) -> tuple[Engine, asyncio.Lock]:
        if sid not in self.sessions:
            base = self.engine.engine
            eng = Engine(base.model_path, context_size=base.n_ctx, threads=base.threads)
            self.sessions[sid] = (eng, asyncio.Lock())
        return self.sessions[sid]

    def snapshot_path(self, sid: str) -> Path:
        if self.sessions_dir is None:
            raise ApiError(400, "this server has no sessions folder (start it with --sessions-dir)")
        return self.sessions_dir / f"{sid}.oxisnap"

    async def save(self, request: Request) -> Response:
        sid = self.session_id(request)
        path = self.snapshot_path(sid)
        if sid not in self.sessions:
            raise ApiError(404, f"no session '{sid}' on this replica", kind="not_found_error")
        eng, lock = self.sessions[sid]
        async with lock:
            await AsyncEngine.snapshot(eng, path)
        return JSONResponse({"id": sid, "tokens": eng.n_past, "path": path.name})

    async def restore(self, request: Request) -> Response:
        sid = self.session_id(request)
        path = self.snapshot_path(sid)
        if not path.is_file():
            raise ApiError(404, f"no saved session '{sid}'", kind="not_found_error")
        try:
            eng = await AsyncEngine.restore(path, threads=self.engine.engine.threads)
        except SnapshotError as e:
            raise ApiError(400, f"cannot restore session '{sid}': {e}") from None
        self.sessions[sid] = (eng, asyncio.Lock())
        return JSONResponse({"id": sid, "tokens": eng.n_past})

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
        stateful: Callable[[Engine, int, dict[str, Any]], Completion],
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
        if sid is not None:
            if not _SESSION_ID.fullmatch(sid):
                raise ApiError(400, "session ids are 1-64 characters of A-Z a-z 0-9 _ -")
            try:
                # Compile now, so a bad grammar is a 400 even when streaming.
                grammar = _constraint(kwargs.pop("grammar", None), kwargs.pop("json_schema", None))
            except GrammarError as e:
                raise ApiError(400, str(e), param="grammar") from None
            kwargs["grammar"] = grammar
            eng, lock = self.session(sid)
            if _field(body, "stream", bool, False):
                return StreamingResponse(
                    self.session_events(eng, lock, stateful, max_tokens, kwargs, shape),
                    media_type="text/event-stream",
                )
            async with lock:
                loop = asyncio.get_running_loop()
                out = await loop.run_in_executor(None, lambda: stateful(eng, max_tokens, kwargs))
            return JSONResponse(final(out))
        if not _field(body, "stream", bool, False):
            try:
                out = await self.engine.generate(tokens, max_tokens, **kwargs)
            except GrammarError as e:
                raise ApiError(400, str(e), param="grammar") from None
            return JSONResponse(final(out))
        result: list[Completion] = []
        try:
            pieces = self.engine.stream(tokens, max_tokens, result=result, **kwargs)
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
                await pieces.aclose()

        return StreamingResponse(events(), media_type="text/event-stream")

    async def session_events(
        self,
        eng: Engine,
        lock: asyncio.Lock,
        stateful: Callable[[Engine, int, dict[str, Any]], Completion],
        max_tokens: int,
        kwargs: dict[str, Any],
        shape: Callable[[str, Completion | None, str | None], dict[str, Any]],
    ) -> AsyncIterator[bytes]:
        """SSE events of a stateful session's generation, which runs in a
        worker thread; a client that goes away stops it at the next token."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str] = asyncio.Queue()
        gone = threading.Event()

        def on_token(_tok: int, piece: str) -> bool:
            if piece:
                loop.call_soon_threadsafe(queue.put_nowait, piece)
            return not gone.is_set()

        async with lock:
            fut = loop.run_in_executor(
                None, lambda: stateful(eng, max_tokens, {**kwargs, "on_token": on_token})
            )
            sent: list[str] = []
            try:
                while True:
                    get: asyncio.Future[Any] = asyncio.ensure_future(queue.get())
                    waiting: set[asyncio.Future[Any]] = {get, fut}
                    done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                    if get in done:
                        sent.append(get.result())
                        yield _sse(shape(sent[-1], None, None))
                        continue
                    get.cancel()
                    while not queue.empty():
                        sent.append(queue.get_nowait())
                        yield _sse(shape(sent[-1], None, None))
                    out = fut.result()
                    tail = out.text[len("".join(sent)) :]
                    if tail:
                        yield _sse(shape(tail, None, None))
                    yield _sse(shape("", out, out.finish_reason))
                    yield b"data: [DONE]\n\n"
                    return
            finally:
                gone.set()
                with contextlib.suppress(BaseException):
                    await fut

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

        def stateful(eng: Engine, n: int, kw: dict[str, Any]) -> Completion:
            # A session appends the prompt to its context (BOS only at the start).
            p = prompt[0] if isinstance(prompt, list) and len(prompt) == 1 else prompt
            return eng.generate(p, n, **kw)

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

        def stateful(eng: Engine, n: int, kw: dict[str, Any]) -> Completion:
            # Only the turns the session has not seen are evaluated.
            return eng.chat(messages, n, **kw)

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
