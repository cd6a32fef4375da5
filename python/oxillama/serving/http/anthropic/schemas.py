"""The JSON Schemas of ``/v1/messages`` and ``/v1/messages/count_tokens``
bodies, in the subset :mod:`..schema_check` runs, so that the route and
``/openapi.json`` agree. Only what we serve is listed: any other field or
content block is refused by name."""

from __future__ import annotations

from typing import Any

from oxillama.serving.http.request_schemas import MAX_TOOLS, SESSION_ID, RequestSchemas

__all__ = ["BLOCKS", "definitions"]

Schema = dict[str, Any]

#: The content blocks a message may hold, by role, and each one's schema.
BLOCKS = {
    "text": "AnthropicTextBlock",
    "tool_use": "AnthropicToolUseBlock",
    "tool_result": "AnthropicToolResultBlock",
    "thinking": "AnthropicThinkingBlock",
}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _kind(name: str) -> Schema:
    return {"type": "string", "const": name}


def _block(kind: str, props: Schema, required: list[str]) -> Schema:
    return {
        "type": "object",
        "properties": {"type": _kind(kind), **props, "cache_control": _ref("AnthropicCache")},
        "required": ["type", *required],
        "additionalProperties": False,
    }


def definitions(rs: RequestSchemas) -> dict[str, Schema]:
    """Named schemas (``#/components/schemas/<name>``) for a server whose
    request bounds are ``rs``."""
    chars = rs.prompt_chars
    text = {"type": "string", "maxLength": chars}
    cache = {
        "type": ["object", "null"],
        "properties": {
            "type": _kind("ephemeral"),
            "ttl": {"type": "string", "enum": ["5m", "1h"]},
        },
        "required": ["type"],
        "additionalProperties": False,
        "description": "Accepted as a hint: the server's prefix cache keeps every prompt's "
        "prefix without being asked.",
    }
    text_block = _block(
        "text",
        {
            "text": text,
            "citations": {
                "type": "null",
                "description": "Only null: citations are not supported.",
            },
        },
        ["text"],
    )
    tool_id = {"type": "string", "pattern": r"^[A-Za-z0-9_-]{1,128}$"}
    tool_use = _block(
        "tool_use",
        {
            "id": tool_id,
            "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
            "input": {"type": "object"},
            # What the SDK's ToolUseBlock dumps beside them, at the values
            # a reply from this server has.
            "caller": {
                "type": ["object", "null"],
                "properties": {"type": _kind("direct")},
                "required": ["type"],
                "additionalProperties": False,
            },
            "toolset_name": {"type": "null"},
        },
        ["id", "name", "input"],
    )
    tool_result = _block(
        "tool_result",
        {
            "tool_use_id": tool_id,
            "content": {
                "anyOf": [
                    text,
                    {"type": "array", "items": _ref("AnthropicTextBlock")},
                ],
                "description": "a string or an array of text blocks",
            },
            "is_error": {"type": ["boolean", "null"]},
        },
        ["tool_use_id"],
    )
    thinking = _block(
        "thinking",
        {"thinking": text, "signature": {"type": "string"}},
        ["thinking"],
    )
    content = {
        "anyOf": [
            text,
            {
                "type": "array",
                "items": {"anyOf": [_ref(name) for name in BLOCKS.values()]},
            },
        ],
        "description": "a string or an array of content blocks (text, tool_use, "
        "tool_result, thinking)",
    }
    message = {
        "type": "object",
        "properties": {
            "role": {"type": "string", "enum": ["user", "assistant"]},
            "content": content,
        },
        "required": ["role", "content"],
        "additionalProperties": False,
    }
    tool = {
        "type": "object",
        "properties": {
            "type": {"type": ["string", "null"], "enum": ["custom", None]},
            "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
            "description": {"type": ["string", "null"], "maxLength": 4096},
            "input_schema": {"type": "object"},
            "strict": {
                "type": ["boolean", "null"],
                "description": "With tool_choice 'auto', a call the model opens runs under "
                "the schema's grammar (calls under 'any' and 'tool' always do).",
            },
            "cache_control": _ref("AnthropicCache"),
        },
        "required": ["name", "input_schema"],
        "additionalProperties": False,
    }
    parallel = {"disable_parallel_tool_use": {"type": ["boolean", "null"]}}
    choice = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"type": {"type": "string", "enum": ["auto", "any"]}, **parallel},
                "required": ["type"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {
                    "type": _kind("tool"),
                    "name": {"type": "string"},
                    **parallel,
                },
                "required": ["type", "name"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"type": _kind("none")},
                "required": ["type"],
                "additionalProperties": False,
            },
        ],
        "description": "{'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}",
    }
    display = {"type": ["string", "null"], "enum": ["summarized", "omitted", None]}
    thinking_config = {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "type": _kind("enabled"),
                    "budget_tokens": {"type": "integer", "minimum": 1024},
                    "display": display,
                },
                "required": ["type", "budget_tokens"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"type": _kind("adaptive"), "display": display},
                "required": ["type"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"type": _kind("disabled")},
                "required": ["type"],
                "additionalProperties": False,
            },
        ],
        "description": "{'type': 'enabled', 'budget_tokens': N >= 1024} (the thinking "
        "is capped at N tokens, then closed), {'type': 'adaptive'} or {'type': 'disabled'}",
    }
    stop = rs.stop()
    counted: Schema = {
        "model": {
            "type": ["string", "null"],
            "maxLength": 256,
            "description": "The served model's name (see /v1/models).",
        },
        "messages": {
            "type": "array",
            "minItems": 1,
            "maxItems": rs.n_ctx,
            "items": _ref("AnthropicMessage"),
        },
        "system": {
            "anyOf": [text, {"type": "array", "items": _ref("AnthropicTextBlock")}],
            "description": "a string or an array of text blocks",
        },
        "tools": {"type": "array", "maxItems": MAX_TOOLS, "items": _ref("AnthropicTool")},
        "tool_choice": choice,
        "thinking": thinking_config,
    }
    request = {
        "type": "object",
        "properties": {
            **counted,
            "max_tokens": {
                "type": "integer",
                "minimum": 1,
                "maximum": rs.max_tokens,
                "description": f"Tokens to generate (thinking included), 1 to {rs.max_tokens}.",
            },
            "stop_sequences": {
                "type": "array",
                "maxItems": rs.limits.max_stop,
                "items": stop["anyOf"][0],
            },
            "stream": {"type": ["boolean", "null"]},
            "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
            "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
            "top_k": {"type": ["integer", "null"], "minimum": 0, "maximum": 2**31 - 1},
            "metadata": {
                "type": ["object", "null"],
                "properties": {"user_id": {"type": ["string", "null"], "maxLength": 256}},
                "additionalProperties": False,
            },
            "session": {
                "type": ["string", "null"],
                "pattern": SESSION_ID,
                "description": "Continue this stateful session (also the X-Session-Id "
                "header); an oxillama extension.",
            },
        },
        "required": ["messages", "max_tokens"],
        "additionalProperties": False,
    }
    return {
        "AnthropicCache": cache,
        "AnthropicTextBlock": text_block,
        "AnthropicToolUseBlock": tool_use,
        "AnthropicToolResultBlock": tool_result,
        "AnthropicThinkingBlock": thinking,
        "AnthropicMessage": message,
        "AnthropicTool": tool,
        "MessagesRequest": request,
        "CountTokensRequest": {
            "type": "object",
            "properties": counted,
            "required": ["messages"],
            "additionalProperties": False,
        },
    }
