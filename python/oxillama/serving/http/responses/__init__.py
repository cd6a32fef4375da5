"""OpenAI's Responses API (``/v1/responses``) on the server: a stored
response is a session holding its conversation's KV, so
``previous_response_id`` evaluates only the new input."""

from __future__ import annotations

from oxillama.serving.http.responses.route import create_response, delete_response, get_response
from oxillama.serving.http.responses.schema import response_request, response_schemas
from oxillama.serving.http.responses.store import StoredResponses

__all__ = [
    "StoredResponses",
    "create_response",
    "delete_response",
    "get_response",
    "response_request",
    "response_schemas",
]
