"""The Messages routes in ``/openapi.json``: their replies, their event
stream and their errors, in Anthropic's shapes."""

from __future__ import annotations

from typing import Any

__all__ = ["messages_paths", "messages_schemas"]

Schema = dict[str, Any]

_STR: Schema = {"type": "string"}
_INT: Schema = {"type": "integer"}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(props: Schema, required: list[str]) -> Schema:
    return {"type": "object", "properties": props, "required": required}


def messages_schemas() -> dict[str, Schema]:
    """The reply schemas (``#/components/schemas/<name>``)."""
    block = {
        "anyOf": [
            _obj({"type": {"const": "text"}, "text": _STR}, ["type", "text"]),
            _obj(
                {"type": {"const": "thinking"}, "thinking": _STR, "signature": _STR},
                ["type", "thinking", "signature"],
            ),
            _obj(
                {
                    "type": {"const": "tool_use"},
                    "id": _STR,
                    "name": _STR,
                    "input": {"type": "object"},
                },
                ["type", "id", "name", "input"],
            ),
        ]
    }
    reasons = ["end_turn", "max_tokens", "stop_sequence", "tool_use"]
    return {
        "AnthropicError": _obj(
            {
                "type": {"const": "error"},
                "error": _obj({"type": _STR, "message": _STR}, ["type", "message"]),
            },
            ["type", "error"],
        ),
        "AnthropicMessageReply": _obj(
            {
                "id": _STR,
                "type": {"const": "message"},
                "role": {"const": "assistant"},
                "model": _STR,
                "content": {"type": "array", "items": block},
                "stop_reason": {"type": ["string", "null"], "enum": [*reasons, None]},
                "stop_sequence": {"type": ["string", "null"]},
                "usage": _obj(
                    {"input_tokens": _INT, "output_tokens": _INT},
                    ["input_tokens", "output_tokens"],
                ),
            },
            ["id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"],
        ),
        "AnthropicTokenCount": _obj({"input_tokens": _INT}, ["input_tokens"]),
    }


_ERRORS = {
    "400": "invalid_request_error: the request is malformed, or holds a field or content "
    "block this server does not serve",
    "401": "authentication_error: no key in x-api-key or Authorization: Bearer, or not one "
    "this server accepts",
    "404": "not_found_error: no such model, or no such (or an evicted) session",
    "413": "request_too_large: the body is over --max-body-bytes",
    "529": "overloaded_error: the server is full for now (retry after Retry-After seconds)",
}


def _operation(summary: str, ok: Schema, body: str, *, guarded: bool) -> Schema:
    codes = ["400", "404", "413", "529", *(["401"] if guarded else [])]
    error = {"application/json": {"schema": _ref("AnthropicError")}}
    op: Schema = {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(body)}}},
        "responses": {
            "200": ok,
            **{c: {"description": _ERRORS[c], "content": error} for c in sorted(codes)},
        },
    }
    if guarded:
        op["security"] = [{"bearer": []}, {"apiKey": []}]
    return op


def messages_paths(*, guarded: bool) -> dict[str, Schema]:
    """The two routes; ``guarded``: they need a key."""
    stream = {
        "text/event-stream": {
            "schema": {
                "type": "string",
                "description": "Server-sent events, each an 'event: <type>' line and a "
                "'data: <JSON>' line: message_start, ping, then per content block "
                "content_block_start, content_block_delta (text_delta, thinking_delta or "
                "input_json_delta) and content_block_stop, then message_delta (stop_reason, "
                "stop_sequence, usage) and message_stop; a ping whenever 10 seconds pass "
                "without an event; an 'error' event if the generation fails midway.",
            }
        }
    }
    reply = {"application/json": {"schema": _ref("AnthropicMessageReply")}}
    return {
        "/v1/messages": {
            "post": _operation(
                "Reply to a conversation (Anthropic's Messages API)",
                {
                    "description": "The message, or its event stream with 'stream': true",
                    "content": {**reply, **stream},
                },
                "MessagesRequest",
                guarded=guarded,
            )
        },
        "/v1/messages/count_tokens": {
            "post": _operation(
                "The prompt's token count for a Messages request (as rendered to run it)",
                {
                    "description": "The count",
                    "content": {"application/json": {"schema": _ref("AnthropicTokenCount")}},
                },
                "CountTokensRequest",
                guarded=guarded,
            )
        },
    }
