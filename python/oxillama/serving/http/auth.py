"""API keys: where they come from, how a request's key is checked, and the
ASGI middleware that guards ``/v1/*`` (and ``/metrics`` on request).

A key comes as ``Authorization: Bearer <key>`` (OpenAI's clients) or as
``x-api-key: <key>`` (Anthropic's), on every guarded route."""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from oxillama.errors import ParameterError
from oxillama.serving.http.anthropic.errors import for_path
from oxillama.serving.http.api_error import ApiError

__all__ = ["ENV_VAR", "ApiKeys", "AuthMiddleware", "api_key_header", "load_api_keys"]

#: The environment variable holding one API key.
ENV_VAR = "OXILLAMA_API_KEY"


def _checked(key: str, where: str) -> str:
    # A key travels in an HTTP header: visible ASCII only. The key itself is
    # never put in the message, only where it came from.
    if not key:
        raise ParameterError(f"an empty API key ({where})")
    if not all(33 <= ord(c) <= 126 for c in key):
        raise ParameterError(
            f"an API key ({where}) holds a space, a control or a non-ASCII character"
        )
    return key


def load_api_keys(
    keys: Iterable[str] = (),
    key_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[str, ...]:
    """Every configured key: ``keys``, the lines of ``key_file`` (blank
    lines and ``#`` comments skipped, surrounding spaces stripped) and
    ``$OXILLAMA_API_KEY`` from ``env`` (``os.environ`` by default)."""
    out = [_checked(k, "given on the command line") for k in keys]
    if key_file is not None:
        path = Path(key_file)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ParameterError(f"cannot read the API key file {path}: {e}") from None
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if line and not line.startswith("#"):
                out.append(_checked(line, f"{path} line {n}"))
    value = (os.environ if env is None else env).get(ENV_VAR)
    if value:
        out.append(_checked(value.strip(), f"${ENV_VAR}"))
    return tuple(dict.fromkeys(out))


class ApiKeys:
    """The accepted keys, kept only as SHA-256 digests: a presented key is
    hashed and compared with every digest in constant time, with no early
    exit, so neither its length nor which key it resembles shows in the
    response time."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = [hashlib.sha256(_checked(k, "build_app").encode()).digest() for k in keys]

    def __bool__(self) -> bool:
        return bool(self._digests)

    def __len__(self) -> int:
        return len(self._digests)

    def accepts(self, presented: bytes) -> bool:
        probe = hashlib.sha256(presented).digest()
        ok = False
        for digest in self._digests:
            ok |= hmac.compare_digest(probe, digest)
        return ok


def bearer_token(scope: Scope) -> bytes | None:
    """The token of the request's ``Authorization: Bearer`` header."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return bytes(token.strip())
            return None
    return None


def api_key_header(scope: Scope) -> bytes | None:
    """The key of the request's ``x-api-key`` header (how Anthropic's
    clients send it)."""
    for name, value in scope.get("headers", ()):
        if name == b"x-api-key":
            return bytes(value.strip()) or None
    return None


def _unauthorized(message: str) -> ApiError:
    return ApiError(
        401,
        message,
        code="invalid_api_key",
        headers={"WWW-Authenticate": 'Bearer realm="oxillama"'},
    )


#: llama-server's routes outside /v1 (its text tools and /rerank), guarded
#: by the keys as the API is.
TEXT_TOOLS = frozenset({"/tokenize", "/detokenize", "/apply-template", "/rerank"})


class AuthMiddleware:
    """Refuses a request to a guarded path without a valid key, before its
    body is read."""

    def __init__(self, app: ASGIApp, keys: ApiKeys, *, metrics_auth: bool) -> None:
        self.app, self.keys, self.metrics_auth = app, keys, metrics_auth

    def guards(self, path: str) -> bool:
        return (
            path == "/v1"
            or path.startswith("/v1/")
            or path in TEXT_TOOLS
            or (self.metrics_auth and path == "/metrics")
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.keys and self.guards(scope["path"]):
            token = bearer_token(scope) or api_key_header(scope)
            path = scope["path"]
            if token is None:
                err = _unauthorized(
                    "no API key: send the header 'Authorization: Bearer <key>' (or "
                    "'x-api-key: <key>') with a key this server was started with"
                )
                await for_path(path, err)(scope, receive, send)
                return
            if not self.keys.accepts(token):
                await for_path(path, _unauthorized("incorrect API key"))(scope, receive, send)
                return
        await self.app(scope, receive, send)
