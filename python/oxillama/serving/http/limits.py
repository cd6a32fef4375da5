"""The server's bounds on what one request may ask for, and the ASGI
middleware that refuses an oversized body before reading all of it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from oxillama.errors import ParameterError
from oxillama.serving.http.anthropic.errors import for_path
from oxillama.serving.http.api_error import ApiError

__all__ = ["BodyLimitMiddleware", "Limits", "format_size", "parse_size"]


@dataclass(frozen=True)
class Limits:
    """Bounds on requests and on the server's sessions; each refused
    request gets OpenAI's error object with the status below."""

    #: Request body size (413 before the rest is read).
    max_body_bytes: int = 4 << 20
    #: Nesting of arrays and objects in a JSON body (400).
    max_json_depth: int = 64
    #: Characters of a prompt, or of all chat messages' text, before
    #: tokenizing (400). ``None``: the most characters that could possibly
    #: fit the context (its size times the longest token's text).
    max_prompt_chars: int | None = None
    #: Stop strings per request, and characters per stop string (400).
    max_stop: int = 16
    max_stop_chars: int = 256
    #: ``logit_bias`` entries (400).
    max_logit_bias: int = 1024
    #: Live stateful sessions; past it the least recently used idle one is
    #: hibernated to the sessions folder, or evicted without one.
    max_sessions: int = 64
    #: Bytes of KV cache the live sessions may hold together (None: no
    #: bound). Past it the least recently used idle sessions leave memory
    #: as past ``max_sessions``; both bounds hold. A quantized KV cache
    #: makes each session smaller, so more of them stay live in it.
    max_session_memory: int | None = None
    #: Ids of evicted sessions remembered (to answer 404 saying why).
    remembered_evictions: int = 10_000
    #: Every session turn ends with its snapshot in the sessions folder,
    #: and a live session whose file another server wrote since is read
    #: again: replicas sharing the folder then continue each other's
    #: sessions exactly, and a lost replica loses at most the turn in flight.
    persist_turns: bool = False

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_json_depth",
            "max_stop",
            "max_stop_chars",
            "max_logit_bias",
            "max_sessions",
            "remembered_evictions",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ParameterError(f"{name} must be a positive integer, got {v!r}")
        for name in ("max_prompt_chars", "max_session_memory"):
            m = getattr(self, name)
            if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
                raise ParameterError(f"{name} must be a positive integer, got {m!r}")


#: Binary multiples, as memory is counted (512M is 512 MiB).
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?", re.IGNORECASE)


def parse_size(text: str, what: str | None = None) -> int:
    """Bytes from ``text``: a whole number of bytes, or a number with a K,
    M, G or T suffix (binary multiples; ``512M``, ``2G``, ``1.5G``,
    ``64KiB``, ``2gb``). Raises :class:`~oxillama.ParameterError` (its
    message starting with ``what``, when given) for anything else, and for
    a size under one byte."""
    at = f"{what}: " if what else ""
    m = _SIZE.fullmatch(text.strip())
    if m is None or (not m.group(2) and "." in m.group(1)):
        raise ParameterError(
            f"{at}expected a number of bytes with an optional K, M, G or T suffix "
            f"(binary: 512M is 512 MiB), got {text!r}"
        )
    n = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if n < 1:
        raise ParameterError(f"{at}expected a size of at least one byte, got {text!r}")
    return n


def format_size(n: int) -> str:
    """``n`` bytes in the largest binary unit that keeps it readable."""
    for unit in ("T", "G", "M", "K"):
        if n >= _UNITS[unit]:
            return f"{n / _UNITS[unit]:.4g} {unit}iB"
    return f"{n} bytes"


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is larger than this server's limit of {limit} bytes (--max-body-bytes)",
        code="request_too_large",
    )


class BodyLimitMiddleware:
    """Reads a request's body up to ``limit`` bytes, then hands it to the
    app whole. A ``Content-Length`` over the limit is refused before any
    body byte is read; a chunked body is refused as soon as its running
    count passes the limit, so a client cannot make the server hold more
    than ``limit`` bytes of it."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if not value.strip().isdigit():
                    err = ApiError(400, "the Content-Length header is not a number")
                    await for_path(scope["path"], err)(scope, receive, send)
                    return
                if int(value) > self.limit:
                    await for_path(scope["path"], _too_large(self.limit))(scope, receive, send)
                    return
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await for_path(scope["path"], _too_large(self.limit))(scope, receive, send)
                return
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(parts)
        replayed = False

        async def replay() -> Message:
            # The body once, then the connection's own messages (a streaming
            # response listens on them for the client hanging up).
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
