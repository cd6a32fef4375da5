"""The session a request continues, named by the ``X-Session-Id`` header
as well as by the body's ``session`` field.

A router in front of several replicas (Ray Serve's proxy, nginx's
``hash $http_x_session_id``) sees headers, not bodies: the header is how a
session's turns reach the replica that holds it live."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .api_error import ApiError

__all__ = ["HEADER", "with_session_header"]

#: Ray Serve's proxy reads this header into a request's ``session_id``.
HEADER = "x-session-id"


def with_session_header(
    headers: Mapping[str, str], body: dict[str, Any], *, required: bool
) -> dict[str, Any]:
    """``body`` with the header's session in its ``session`` field.

    Both given must agree. With ``required`` (behind a router that routes
    by the header), a session named only in the body is refused: it would
    be answered, exactly, but by whichever replica the router picked, each
    turn restoring the session from the store."""
    sid = headers.get(HEADER)
    named = body.get("session")
    if sid is None:
        if required and named is not None:
            raise ApiError(
                400,
                f"this deployment routes sessions by the X-Session-Id header: send "
                f"'X-Session-Id: {str(named)[:64]}' with the request",
                param="session",
            )
        return body
    if named is not None and named != sid:
        raise ApiError(
            400,
            f"the X-Session-Id header ({sid[:64]!r}) and the body's 'session' "
            f"({str(named)[:64]!r}) differ",
            param="session",
        )
    return {**body, "session": sid}
