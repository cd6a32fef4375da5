"""The routes that list, name, fork, delete, export and import the
server's sessions (what the chat page's session list runs on), and
``/v1/info``, what the page shows of the model:

- ``GET /v1/sessions``: every session the server knows (live, saved in the
  folder, or with notes), newest first;
- ``GET``/``PUT``/``DELETE /v1/sessions/{sid}``: one session's notes
  (title, messages, settings; :mod:`.session_notes`) and state;
- ``POST /v1/sessions/{sid}/fork``: a new session holding a copy of this
  one's state, with the history up to the message forked from;
- ``GET``/``PUT /v1/sessions/{sid}/snapshot``: the session as an OXISNAP1
  file, and a file made the session;
- ``GET /v1/info``: the model's name, context size and KV cache type.

A fork is exact: every chat turn of a session renders its whole history,
keeps the common prefix of its context and evaluates the rest with a
sampler fresh from the request's settings, and the engine computes a
position's KV from the tokens before it alone, so the fork's next turn
gives the tokens the source would give for the same messages."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from oxillama.serving.async_engine import AsyncEngine
from oxillama.serving.http.api_error import ApiError
from oxillama.serving.http.session_notes import SessionNotes
from oxillama.serving.http.session_table import SessionTable

__all__ = [
    "delete_session",
    "export_snapshot",
    "fork_session",
    "get_session",
    "import_snapshot",
    "info",
    "list_sessions",
    "put_session",
]


class Server(Protocol):
    """What the routes need of the app's server (``app.Server``)."""

    engine: AsyncEngine
    model_name: str
    n_ctx: int
    splits_reasoning: bool
    sessions: SessionTable
    notes: SessionNotes

    async def body(self, request: Request, schema: str) -> dict[str, Any]: ...

    def session_id(self, request: Request) -> str: ...


def _summary(server: Server, sid: str, live: dict[str, int], saved: set[str]) -> dict[str, Any]:
    notes = server.notes.get(sid) or {}
    return {
        "id": sid,
        "title": notes.get("title"),
        "tokens": live.get(sid),
        "live": sid in live,
        "saved": sid in saved,
        "n_messages": len(notes.get("messages", [])),
        "updated": notes.get("updated"),
    }


async def list_sessions(server: Server, request: Request) -> Response:
    live = server.sessions.live_tokens()
    saved = set(server.sessions.saved_ids())
    ids = set(live) | saved | set(server.notes.ids())
    rows = [_summary(server, sid, live, saved) for sid in ids]
    rows.sort(key=lambda r: (-(r["updated"] or 0.0), r["id"]))
    return JSONResponse({"object": "list", "data": rows})


def _session(server: Server, sid: str) -> dict[str, Any]:
    live = server.sessions.live_tokens()
    saved = set(server.sessions.saved_ids())
    notes = server.notes.get(sid)
    if notes is None and sid not in live and sid not in saved:
        raise ApiError(404, f"no session '{sid}' on this server", kind="not_found_error")
    notes = notes or {}
    return {
        **_summary(server, sid, live, saved),
        "messages": notes.get("messages", []),
        "settings": notes.get("settings"),
    }


async def get_session(server: Server, request: Request) -> Response:
    return JSONResponse(_session(server, server.session_id(request)))


async def put_session(server: Server, request: Request) -> Response:
    sid = server.session_id(request)
    body = await server.body(request, "SessionNotesRequest")
    await asyncio.to_thread(
        server.notes.put, sid, body["title"], body["messages"], body.get("settings")
    )
    return JSONResponse(_session(server, sid))


async def delete_session(server: Server, request: Request) -> Response:
    sid = server.session_id(request)
    had_state = await server.sessions.delete(sid)
    had_notes = server.notes.delete(sid)
    if not (had_state or had_notes):
        raise ApiError(404, f"no session '{sid}' on this server", kind="not_found_error")
    return JSONResponse({"id": sid, "deleted": True})


async def fork_session(server: Server, request: Request) -> Response:
    src = server.session_id(request)
    body = await server.body(request, "SessionForkRequest")
    dst = body.get("id") or f"s{uuid.uuid4().hex[:16]}"
    if dst == src:
        raise ApiError(400, "a fork needs an id of its own", param="id")
    if server.notes.get(dst) is not None:
        raise ApiError(409, f"session '{dst}' already exists", param="id", code="session_exists")
    _session(server, src)  # a 404 for a session this server does not know
    sess = await server.sessions.fork(src, dst)
    await asyncio.to_thread(
        server.notes.put, dst, body["title"], body["messages"], body.get("settings")
    )
    return JSONResponse(
        {"id": dst, "copied": sess is not None, "tokens": 0 if sess is None else sess.n_past}
    )


async def export_snapshot(server: Server, request: Request) -> Response:
    sid = server.session_id(request)
    blob = await server.sessions.snapshot_bytes(sid)
    return Response(
        blob,
        media_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{sid}.oxisnap"'},
    )


async def import_snapshot(server: Server, request: Request) -> Response:
    sid = server.session_id(request)
    blob = await request.body()
    if not blob:
        raise ApiError(400, "the body must be an OXISNAP1 snapshot file; it is empty", param="body")
    sess = await server.sessions.replace_from_bytes(sid, blob)
    return JSONResponse({"id": sid, "tokens": sess.n_past})


async def info(server: Server, request: Request) -> Response:
    engine = server.engine
    return JSONResponse(
        {
            "model": server.model_name,
            "arch": engine.engine.arch,
            "n_ctx": server.n_ctx,
            "kv_type": engine.kv_dtype,
            "reasoning": server.splits_reasoning,
            "sessions_dir": server.sessions.folder is not None,
        }
    )
