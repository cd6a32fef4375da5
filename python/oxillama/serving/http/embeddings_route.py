"""``POST /v1/embeddings`` in OpenAI's shape: one vector per input, as
float arrays or base64 of little-endian float32, optionally cut to the
first ``dimensions`` values and renormalized (Matryoshka-style)."""

from __future__ import annotations

import base64
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from oxillama.engine import embeddings as _emb
from oxillama.serving.async_engine import AsyncEngine
from oxillama.serving.http.api_error import ApiError

__all__ = ["embeddings"]


class Server(Protocol):
    """What the route needs of the app's server (``app.Server``), which
    mounts it: the route sits below the app and never imports it."""

    engine: AsyncEngine
    model_name: str

    async def body(self, request: Request, schema: str) -> dict[str, Any]: ...


def _encode(v: npt.NDArray[np.float32], fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in v]


async def embeddings(server: Server, request: Request) -> Response:
    body = await server.body(request, "EmbeddingRequest")
    engine = server.engine
    pooling = engine.engine.pooling
    if pooling == "none":
        raise ApiError(
            400,
            "this model's pooling is 'none' (per-token vectors): it gives no single "
            "embedding per input",
            param="input",
        )
    inputs = body["input"]
    fmt = body.get("encoding_format") or "float"
    dims: int | None = body.get("dimensions")
    n = _emb.max_len(engine.engine._model, engine.engine.n_ctx)
    # Usage counts the tokens the model ran (after any truncation).
    prepared = _emb.prepare(
        inputs, engine.engine.tokenizer, n, truncate=bool(body.get("truncate") or False)
    )
    out = await engine.embed(
        [list(s) for s in prepared.seqs], pooling=pooling, normalize=dims is None
    )
    vecs: Any = np.atleast_2d(out)
    if dims is not None:
        vecs = vecs[:, :dims].astype(np.float64)
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        vecs = (vecs / np.where(norms > 0, norms, 1.0)).astype(np.float32)
    used = sum(len(s) for s in prepared.seqs)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": _encode(v, fmt)}
                for i, v in enumerate(vecs)
            ],
            "model": body.get("model") or server.model_name,
            "usage": {"prompt_tokens": used, "total_tokens": used},
        }
    )
