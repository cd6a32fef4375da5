"""Request ids and the access log: ASGI middleware that takes a client's
``X-Request-Id`` (or makes one), echoes it on the response, and writes one
JSON line per request to the ``oxillama.access`` logger when the response
ends: id, method, path, status, latency, and what the handler noted (the
session, prompt and completion tokens). Bodies, headers and query strings
are never logged, so neither prompts nor keys reach the log."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["HEADER", "RequestLog", "note"]

HEADER = "x-request-id"
#: Ids a client may choose: what proxies and tracing systems send (uuids,
#: hex, dotted or dashed tokens), short enough for one log line.
_ID_OK = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
log = logging.getLogger("oxillama.access")


def note(scope_state: Any) -> dict[str, Any]:
    """The access record of a request (``request.state``), for a handler
    to add its fields to; an empty, unlogged dict outside the middleware."""
    record = getattr(scope_state, "access", None)
    return record if isinstance(record, dict) else {}


class RequestLog:
    """``count(path, status)``, when given, is told of every request as it
    is logged (the requests-by-route counter)."""

    def __init__(self, app: ASGIApp, count: Callable[[str, int], None] | None = None) -> None:
        self.app, self.count = app, count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == HEADER.encode()), b"").decode(
            "latin-1"
        )
        rid = given if _ID_OK.fullmatch(given) else uuid.uuid4().hex
        record: dict[str, Any] = {"id": rid}
        scope.setdefault("state", {})["access"] = record
        t0 = time.perf_counter()
        status = 500
        logged = False

        def write() -> None:
            nonlocal logged
            if logged:
                return
            logged = True
            line = {
                "id": rid,
                "method": scope.get("method"),
                "path": scope.get("path"),
                "status": status,
                "latency_ms": round((time.perf_counter() - t0) * 1e3, 2),
                **{k: v for k, v in record.items() if k != "id"},
            }
            log.info(json.dumps(line, separators=(",", ":")))
            if self.count is not None:
                self.count(str(scope.get("path", "")), status)

        async def tagged(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = [(k, v) for k, v in message.get("headers", []) if k != HEADER.encode()]
                message = {**message, "headers": [*headers, (HEADER.encode(), rid.encode())]}
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                # Before the last byte goes out: once a client has its whole
                # response, its log line exists.
                write()
            await send(message)

        try:
            await self.app(scope, receive, tagged)
        finally:
            # A response that never finished (client gone, error) is logged
            # with what was known.
            write()
