"""The JSON Schema of a ``POST /v1/responses`` body, checked by the route
and published in ``/openapi.json``.

The top level is closed: a field we do not serve is refused by name. The
items of ``input``, ``tools``, ``tool_choice`` and ``text`` are only
typed here; :mod:`.request` reads them and refuses each kind it does not
serve (an ``input_image`` part, a ``web_search`` tool) with a message
naming it, which a schema's ``anyOf`` could not say as clearly."""

from __future__ import annotations

from typing import Any

from oxillama.serving.http.request_schemas import MAX_TOOLS, RequestSchemas

__all__ = ["RESPONSE_ID", "response_request", "response_schemas"]

Schema = dict[str, Any]

#: A response's id, which is also its session's id.
RESPONSE_ID = r"^resp_[A-Za-z0-9_-]{1,59}$"

#: The most input items one request may hold.
MAX_ITEMS = 4096


def response_request(s: RequestSchemas) -> Schema:
    """The body of ``POST /v1/responses`` for a model with ``s``'s bounds."""
    text = {"type": "string", "maxLength": s.prompt_chars}
    return {
        "type": "object",
        "properties": {
            "model": {
                "type": ["string", "null"],
                "maxLength": 256,
                "description": "The served model's name (see /v1/models).",
            },
            "input": {
                "anyOf": [
                    text,
                    {
                        "type": "array",
                        "maxItems": MAX_ITEMS,
                        "items": {"type": "object"},
                    },
                ],
                "description": "A user message as a string, or a list of items: messages "
                "(role user, system, developer or assistant; content a string or "
                "input_text / output_text parts), function_call, function_call_output, "
                "reasoning.",
            },
            "instructions": {
                **text,
                "type": ["string", "null"],
                "description": "A system message put first; not carried over from "
                "previous_response_id (as OpenAI).",
            },
            "tools": {
                "type": ["array", "null"],
                "maxItems": MAX_TOOLS,
                "items": {"type": "object"},
                "description": "Function tools {'type': 'function', 'name', 'description', "
                "'parameters', 'strict'}; built-in tools are not served.",
            },
            "tool_choice": {
                "anyOf": [
                    {"type": "string", "enum": ["none", "auto", "required"]},
                    {"type": "object"},
                    {"type": "null"},
                ],
                "description": "'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
            },
            "parallel_tool_calls": {"type": ["boolean", "null"]},
            "text": {
                "type": ["object", "null"],
                "description": "{'format': {'type': 'text'}}, {'format': {'type': "
                "'json_object'}} or {'format': {'type': 'json_schema', 'name': ..., "
                "'schema': {...}}}: the output is guaranteed to match the schema.",
            },
            "max_output_tokens": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": s.max_tokens,
                "description": f"Tokens to generate, reasoning included; default "
                f"{min(256, s.n_ctx)}.",
            },
            "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
            "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
            "store": {
                "type": ["boolean", "null"],
                "description": "Keep the response (default true): it is a session of the "
                "server holding its KV cache, so previous_response_id continues it by "
                "evaluating only the new input. Stored responses obey --max-sessions and "
                "--max-session-memory like any session.",
            },
            "previous_response_id": {
                "type": ["string", "null"],
                "pattern": RESPONSE_ID,
                "description": "Continue the conversation of this stored response.",
            },
            "stream": {"type": ["boolean", "null"]},
            "metadata": {
                "type": ["object", "null"],
                "maxProperties": 16,
                "propertyNames": {"type": "string", "maxLength": 64},
                "additionalProperties": {"type": "string", "maxLength": 512},
            },
            "user": {"type": ["string", "null"], "maxLength": 256},
            "include": {
                "type": ["array", "null"],
                "maxItems": 0,
                "description": "Only empty or null: no extra output data is served.",
            },
            "truncation": {
                "type": ["string", "null"],
                "enum": ["disabled", None],
                "description": "Only 'disabled' or null: an input longer than the context "
                "is refused, never cut.",
            },
        },
        "required": ["input"],
        "additionalProperties": False,
    }


def _obj(props: dict[str, Schema], optional: tuple[str, ...] = ()) -> Schema:
    return {
        "type": "object",
        "properties": props,
        "required": [k for k in props if k not in optional],
    }


def response_schemas() -> dict[str, Schema]:
    """The reply schemas of the routes: the response object (the reply of
    ``POST``, ``GET``, and the ``response`` of the stream's first and last
    events) and the deletion's."""
    string, integer = {"type": "string"}, {"type": "integer"}
    status = {"type": "string", "enum": ["in_progress", "completed", "incomplete"]}
    text_part = _obj(
        {
            "type": {"const": "output_text"},
            "text": string,
            "annotations": {"type": "array", "maxItems": 0},
            "logprobs": {"type": "array"},
        }
    )
    message = _obj(
        {
            "type": {"const": "message"},
            "id": string,
            "role": {"const": "assistant"},
            "status": status,
            "content": {"type": "array", "items": text_part},
        }
    )
    call = _obj(
        {
            "type": {"const": "function_call"},
            "id": string,
            "call_id": string,
            "name": string,
            "arguments": {"type": "string", "description": "A JSON object, as a string"},
            "status": status,
        }
    )
    reasoning = _obj(
        {
            "type": {"const": "reasoning"},
            "id": string,
            "summary": {"type": "array", "maxItems": 0},
            "content": {
                "type": "array",
                "items": _obj({"type": {"const": "reasoning_text"}, "text": string}),
            },
            "status": status,
        }
    )
    usage = _obj(
        {
            "input_tokens": integer,
            "input_tokens_details": _obj(
                {
                    "cached_tokens": {
                        "type": "integer",
                        "description": "Prompt tokens restored from the previous response's "
                        "session instead of evaluated",
                    },
                    "cache_write_tokens": {
                        "type": "integer",
                        "description": "Prompt tokens evaluated into this response's session",
                    },
                }
            ),
            "output_tokens": integer,
            "output_tokens_details": _obj({"reasoning_tokens": integer}),
            "total_tokens": integer,
        }
    )
    nullable_str = {"type": ["string", "null"]}
    response = _obj(
        {
            "id": string,
            "object": {"const": "response"},
            "created_at": integer,
            "completed_at": {"type": ["integer", "null"]},
            "status": status,
            "error": {"type": "null"},
            "incomplete_details": {
                "anyOf": [_obj({"reason": {"const": "max_output_tokens"}}), {"type": "null"}]
            },
            "instructions": nullable_str,
            "max_output_tokens": {"type": ["integer", "null"]},
            "model": string,
            "output": {"type": "array", "items": {"anyOf": [message, call, reasoning]}},
            "parallel_tool_calls": {"type": "boolean"},
            "previous_response_id": nullable_str,
            "store": {"type": "boolean"},
            "temperature": {"type": "number"},
            "text": _obj({"format": {"type": "object"}}),
            "tool_choice": {"anyOf": [string, {"type": "object"}]},
            "tools": {"type": "array", "items": {"type": "object"}},
            "top_p": {"type": "number"},
            "truncation": {"const": "disabled"},
            "usage": {"anyOf": [usage, {"type": "null"}]},
            "user": nullable_str,
            "metadata": {"type": "object", "additionalProperties": string},
        }
    )
    deleted = _obj({"id": string, "object": {"const": "response"}, "deleted": {"const": True}})
    return {"Response": response, "ResponseDeleted": deleted}
