"""llama-server's text tools, in its shapes, for clients that count and
render before they generate:

- ``POST /tokenize``: ``content`` -> ``tokens`` (ids, or with
  ``with_pieces`` objects of ``id`` and ``piece``: the piece's text, or
  its bytes where they are not whole UTF-8);
- ``POST /detokenize``: ``tokens`` -> ``content``;
- ``POST /apply-template``: a chat request's ``messages`` (and ``tools``)
  -> the ``prompt`` the chat endpoint would run, rendered the same way.
"""

from __future__ import annotations

from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from oxillama.decoding.tool_calls import ToolFormat
from oxillama.serving.async_engine import AsyncEngine
from oxillama.serving.http.tools import tool_request

__all__ = ["apply_template", "detokenize", "tokenize"]


class Server(Protocol):
    """What the routes need of the app's server (``app.Server``), which
    mounts them: they sit below the app and never import it."""

    engine: AsyncEngine
    tool_format: ToolFormat | None

    async def body(self, request: Request, schema: str) -> dict[str, Any]: ...


def _piece(raw: bytes) -> str | list[int]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


async def tokenize(server: Server, request: Request) -> Response:
    body = await server.body(request, "TokenizeRequest")
    engine = server.engine.engine
    ids = engine.tokenize(
        body["content"],
        add_special=bool(body.get("add_special") or False),
        parse_special=body.get("parse_special") is not False,
    )
    if body.get("with_pieces"):
        return JSONResponse(
            {"tokens": [{"id": t, "piece": _piece(engine.token_to_piece(t))} for t in ids]}
        )
    return JSONResponse({"tokens": ids})


async def detokenize(server: Server, request: Request) -> Response:
    body = await server.body(request, "DetokenizeRequest")
    return JSONResponse({"content": server.engine.engine.detokenize(body["tokens"])})


async def apply_template(server: Server, request: Request) -> Response:
    body = await server.body(request, "ApplyTemplateRequest")
    engine = server.engine.engine
    messages = body["messages"]
    variables: dict[str, Any] = dict(body.get("chat_template_kwargs") or {})
    treq = tool_request(body, engine.chat_template_source, server.tool_format)
    if treq is not None:
        messages, tools = treq.template_input(messages)
        variables.update(tools)
    prompt = engine.apply_chat_template(
        messages, add_generation_prompt=body.get("add_generation_prompt") is not False, **variables
    )
    return JSONResponse({"prompt": prompt})
