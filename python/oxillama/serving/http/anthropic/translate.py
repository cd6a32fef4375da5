"""A Messages request as the chat endpoint's inputs: its ``system`` and
content blocks as chat messages (tool calls and results included), its
tools and ``tool_choice`` in the chat form that
:func:`~oxillama.serving.http.tools.tool_request` checks and compiles.

Content blocks are checked one by one before the body's schema, so that
an unsupported block (an image, a document, ...) is refused by its type
and place rather than as "not any of the allowed blocks"."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oxillama.serving.http.anthropic.schemas import BLOCKS
from oxillama.serving.http.api_error import ApiError
from oxillama.serving.http.schema_check import check

__all__ = ["Conversation", "chat_tools", "check_blocks", "conversation"]

#: Which role may hold which block.
_ROLES = {
    "text": ("user", "assistant"),
    "tool_use": ("assistant",),
    "tool_result": ("user",),
    "thinking": ("assistant",),
}


def _unsupported(path: str, kind: Any) -> ApiError:
    return ApiError(
        400,
        f"{path}: content blocks of type {json.dumps(kind)[:40]} are not supported "
        "(this server takes text, tool_use, tool_result and thinking blocks)",
        param=path.split("[", 1)[0].split(".", 1)[0],
    )


def _check_text_blocks(blocks: Any, path: str, defs: Mapping[str, Any]) -> None:
    if not isinstance(blocks, list):
        return
    for j, b in enumerate(blocks):
        where = f"{path}[{j}]"
        if isinstance(b, Mapping) and b.get("type") != "text":
            raise _unsupported(where, b.get("type"))
        check(b, defs["AnthropicTextBlock"], where, defs)


def check_blocks(body: Mapping[str, Any], defs: Mapping[str, Any]) -> None:
    """Refuses the first content block we do not serve, naming its type
    and where it is, and checks each served one against its schema."""
    _check_text_blocks(body.get("system"), "system", defs)
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("content"), list):
            continue
        for j, b in enumerate(m["content"]):
            where = f"messages[{i}].content[{j}]"
            if not isinstance(b, Mapping):
                continue
            kind = b.get("type")
            if not isinstance(kind, str) or kind not in BLOCKS:
                raise _unsupported(where, kind)
            if m.get("role") in ("user", "assistant") and m["role"] not in _ROLES[kind]:
                raise ApiError(
                    400,
                    f"{where}: a {kind} block belongs in a "
                    f"{' or '.join(_ROLES[kind])} message, not a {m['role']} one",
                    param="messages",
                )
            if kind == "tool_result":
                _check_text_blocks(b.get("content"), f"{where}.content", defs)
            check(b, defs[BLOCKS[kind]], where, defs)


@dataclass(frozen=True)
class Conversation:
    """The chat messages to render, and the text of a final assistant turn
    that the reply continues (Anthropic's prefill; ``""`` when none)."""

    messages: list[dict[str, Any]]
    prefill: str


def _text(blocks: Sequence[Mapping[str, Any]] | str | None) -> str:
    if blocks is None:
        return ""
    if isinstance(blocks, str):
        return blocks
    return "\n".join(b["text"] for b in blocks)


def conversation(body: Mapping[str, Any]) -> Conversation:
    """The checked body's ``system`` and ``messages`` as chat messages.

    An assistant's ``tool_use`` blocks are its ``tool_calls``; a user's
    ``tool_result`` blocks are ``tool`` messages (before the text the same
    turn holds), a result with ``is_error`` reading ``Error: ...``;
    ``thinking`` blocks of earlier turns are not rendered again, as
    Anthropic drops them from the context."""
    out: list[dict[str, Any]] = []
    system = _text(body.get("system"))
    if system:
        out.append({"role": "system", "content": system})
    names: dict[str, str] = {}
    messages = body["messages"]
    for i, m in enumerate(messages):
        content = m["content"]
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        texts = [b["text"] for b in content if b["type"] == "text"]
        if m["role"] == "assistant":
            calls = []
            for b in content:
                if b["type"] == "tool_use":
                    names[b["id"]] = b["name"]
                    args = json.dumps(b["input"], ensure_ascii=False)
                    calls.append(
                        {
                            "id": b["id"],
                            "type": "function",
                            "function": {"name": b["name"], "arguments": args},
                        }
                    )
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
            if calls:
                msg["content"] = msg["content"] or None
                msg["tool_calls"] = calls
            out.append(msg)
            continue
        results = [b for b in content if b["type"] == "tool_result"]
        for b in results:
            name = names.get(b["tool_use_id"])
            if name is None:
                raise ApiError(
                    400,
                    f"messages[{i}]: tool_result for '{b['tool_use_id']}', which no earlier "
                    "assistant turn's tool_use has as its id",
                    param="messages",
                )
            result = _text(b.get("content"))
            if b.get("is_error"):
                result = f"Error: {result}"
            out.append(
                {"role": "tool", "tool_call_id": b["tool_use_id"], "name": name, "content": result}
            )
        if texts or not results:
            out.append({"role": "user", "content": "\n".join(texts)})
    prefill = ""
    last = messages[-1]
    if last["role"] == "assistant":
        if out[-1].get("tool_calls"):
            raise ApiError(
                400,
                "the last message is an assistant turn with tool_use blocks: a final "
                "assistant turn may only hold text for the reply to continue",
                param="messages",
            )
        prefill = out.pop()["content"] or ""
    return Conversation(out, prefill)


def chat_tools(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request's ``tools`` and ``tool_choice`` as the chat endpoint
    takes them."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description"),
                "parameters": t["input_schema"],
                "strict": bool(t.get("strict")),
            },
        }
        for t in body.get("tools") or []
    ]
    choice = body.get("tool_choice")
    if choice is None:
        return {"tools": tools}
    kind = choice["type"]
    parallel = not choice.get("disable_parallel_tool_use")
    if kind == "none":
        return {"tools": tools, "tool_choice": "none"}
    if kind == "tool":
        named = {"type": "function", "function": {"name": choice["name"]}}
        return {"tools": tools, "tool_choice": named, "parallel_tool_calls": False}
    return {
        "tools": tools,
        "tool_choice": "required" if kind == "any" else "auto",
        "parallel_tool_calls": parallel,
    }
