"""The session a request continues, named by the ``X-Session-Id`` header
as well as by the body's ``session`` field.

A router in front of several replicas (Ray Serve's proxy, nginx's
``hash $http_x_session_id``) sees headers, not bodies: the header is how a
session's turns reach the replica that holds it live. A session named in
the body only is served all the same, by whichever replica the router
picked, which restores it from the sessions folder where it is not live."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oxillama.serving.http.api_error import ApiError

__all__ = ["HEADER", "with_session_header"]

#: Ray Serve's proxy reads this header into a request's ``session_id``.
HEADER = "x-session-id"


def with_session_header(headers: Mapping[str, str], body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with the header's session in its ``session`` field; both
    given must agree."""
    sid = headers.get(HEADER)
    if sid is None:
        return body
    named = body.get("session")
    if named is not None and named != sid:
        raise ApiError(
            400,
            f"the X-Session-Id header ({sid[:64]!r}) and the body's 'session' "
            f"({str(named)[:64]!r}) differ",
            param="session",
        )
    return {**body, "session": sid}
