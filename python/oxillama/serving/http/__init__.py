"""An OpenAI-compatible HTTP server over :class:`~oxillama.AsyncEngine`.

Routes: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (both with ``stream: true`` over SSE),
OpenAI's Responses API (``POST /v1/responses``, ``GET`` and ``DELETE
/v1/responses/{id}``; a stored response is a session),
``POST /v1/sessions/{id}/save`` and ``.../restore``, ``GET /metrics``
(``prometheus_client``'s text) and ``GET /openapi.json`` (OpenAPI 3.1, the request
schemas the routes check bodies against). Sampling fields beyond OpenAI's
are accepted in the body as vLLM and llama-server accept them: ``top_k``,
``min_p``, ``repetition_penalty``, ``mirostat``, ``ignore_eos``,
``grammar``; ``response_format`` takes ``json_schema`` and ``json_object``;
``session`` continues a stateful session. Unknown fields, and OpenAI
fields this server cannot honour (``tools``, ``echo``, ``suffix``...), are
refused with a 400 naming them rather than ignored.

Errors use OpenAI's error object and status codes. With API keys, every
``/v1/*`` route needs ``Authorization: Bearer <key>``. Request bodies, JSON
nesting, prompts, ``max_tokens``, stop strings, ``logit_bias`` and the
number of live sessions are bounded (:class:`Limits`). A client that
disconnects cancels its generation.

Needs ``pip install oxillama[server]`` (Starlette, uvicorn, prometheus_client).
"""

from __future__ import annotations

from oxillama.serving.http.app import build_app
from oxillama.serving.http.auth import load_api_keys
from oxillama.serving.http.limits import Limits
from oxillama.serving.http.serve import serve

__all__ = ["Limits", "build_app", "load_api_keys", "serve"]
