"""``POST /v1/rerank`` (and ``/rerank``) in llama-server's shape: a query
and documents in, each document's index and relevance score out, best
first. Served when the server runs a reranker and was started with
``--reranking``, as llama-server is."""

from __future__ import annotations

from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from oxillama.serving.async_engine import AsyncEngine
from oxillama.serving.http.api_error import ApiError

__all__ = ["rerank"]


class Server(Protocol):
    """What the route needs of the app's server (``app.Server``)."""

    engine: AsyncEngine
    model_name: str
    reranking: bool

    async def body(self, request: Request, schema: str) -> dict[str, Any]: ...


async def rerank(server: Server, request: Request) -> Response:
    if not server.reranking:
        raise ApiError(
            501,
            "this server does not rerank: start it with --reranking (and a reranker model)",
            kind="not_supported_error",
        )
    body = await server.body(request, "RerankRequest")
    engine = server.engine
    seqs, top_n = engine.rerank_pairs(body["query"], body["documents"], body.get("top_n"))
    results = await engine.rerank_tokens(seqs, top_n)
    used = sum(len(s) for s in seqs)
    return JSONResponse(
        {
            "model": body.get("model") or server.model_name,
            "object": "list",
            "usage": {"prompt_tokens": used, "total_tokens": used},
            "results": [{"index": r.index, "relevance_score": r.relevance_score} for r in results],
        }
    )
