"""Errors on the Messages routes in Anthropic's shape,
``{"type": "error", "error": {"type", "message"}}``: the same failures as
the OpenAI routes (:class:`ApiError`), typed as Anthropic types them."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from oxillama.errors import OxiLlamaError
from oxillama.serving.http.api_error import ApiError, from_library_error

__all__ = [
    "OVERLOADED",
    "anthropic_error",
    "error_body",
    "for_path",
    "guarded",
    "is_anthropic_path",
]

log = logging.getLogger("oxillama.server")

#: Anthropic's status for an overloaded API (its SDKs retry it).
OVERLOADED = 529

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    OVERLOADED: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    """Whether ``path`` is one of the Messages routes."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_error(e: ApiError) -> tuple[int, dict[str, Any]]:
    """The status and body Anthropic's API would answer for ``e``: a
    full server (our 503) is its 529 ``overloaded_error``; a 4xx keeps its
    status; anything else is an ``api_error``. The field a 400 is about
    leads its message, since Anthropic's error has no ``param``."""
    status = OVERLOADED if e.status == 503 else e.status
    kind = _TYPES.get(status, "invalid_request_error" if 400 <= status < 500 else "api_error")
    message = e.message
    if e.param and e.param not in message:
        message = f"{e.param}: {message}"
    return status, error_body(kind, message)


def response(e: ApiError) -> Response:
    status, body = anthropic_error(e)
    headers: Mapping[str, str] = e.headers
    return JSONResponse(body, status_code=status, headers=dict(headers))


def guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[..., Any]:
    """The route answering every error in Anthropic's shape: a 4xx for
    anything about the request (every ``OxiLlamaError`` included), a
    logged 500 ``api_error`` with a generic message for anything else."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as e:
            return response(e)
        except OxiLlamaError as e:
            return response(from_library_error(e))
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return JSONResponse(error_body("api_error", "internal server error"), status_code=500)

    return endpoint


def for_path(path: str, e: ApiError) -> Response:
    """``e`` answered in the shape of the route ``path`` belongs to: for
    the middlewares and handlers that answer before any route runs."""
    return response(e) if is_anthropic_path(path) else e.response()
