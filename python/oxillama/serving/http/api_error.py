"""Errors answered with OpenAI's error object, and which status each
library error gets."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.responses import JSONResponse

from oxillama.errors import (
    GrammarError,
    JsonSchemaError,
    KvCacheFullError,
    OverloadedError,
    OxiLlamaError,
    TemplateError,
)

__all__ = ["ApiError", "error_body", "from_library_error"]

#: Seconds a client is told to wait after a 503 (the queue and the session
#: table drain in about one turn).
RETRY_AFTER = "1"


def error_body(
    message: str, kind: str, param: str | None = None, code: str | None = None
) -> dict[str, dict[str, str | None]]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class ApiError(Exception):
    """An error answered with OpenAI's error object
    ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.code = param, code
        self.headers = dict(headers or {})
        if status == 503:
            self.headers.setdefault("Retry-After", RETRY_AFTER)

    def response(self) -> JSONResponse:
        body = error_body(self.message, self.kind, self.param, self.code)
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def from_library_error(e: OxiLlamaError) -> ApiError:
    """The answer to a library error that escaped a route: a 503 when the
    server is full for now, otherwise a 400 (the request cannot be served
    as it is). Never a 500: every ``OxiLlamaError`` is about the request."""
    if isinstance(e, (OverloadedError, KvCacheFullError)):
        return ApiError(503, str(e), kind="server_error", code="overloaded")
    param = None
    if isinstance(e, JsonSchemaError):
        param = "response_format"
    elif isinstance(e, GrammarError):
        param = "grammar"
    elif isinstance(e, TemplateError):
        param = "messages"
    return ApiError(400, str(e), param=param)
