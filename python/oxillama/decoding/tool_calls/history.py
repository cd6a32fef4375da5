"""A conversation's tool calls and results as a chat template can render
them, with tools in the request or without.

The OpenAI API returns an assistant turn that calls tools with ``content:
null`` beside its ``tool_calls`` (arguments as a JSON string), and agent
loops send that turn back, then ``tool`` messages, often with no ``tools``
in the request (or ``tool_choice: "none"``) when they ask for the final
answer. Every such history must render:

- a template that renders ``tool_calls`` gets the calls with their
  arguments as mappings, as Hugging Face templates read them;
- a template that does not gets each call as the ``<tool_call>`` text the
  model was asked to write (:func:`tools_instructions`), and a tool's
  result as plain content; where the template has no ``tool`` role
  either, the result comes back as a user turn holding a
  ``<tool_response>`` block, so it is never silently dropped;
- a template that insists on alternating roles (Gemma's and Mistral's
  ``raise_exception('Conversation roles must alternate ...')``) and does
  not render tools gets consecutive turns of one role joined into one (two
  tool results, now two user turns, or results and the user's next
  words), the contents separated by a blank line;
- an assistant turn's ``null`` content becomes ``""`` where the template
  cannot take ``None`` (:func:`without_null_content`, for the retry); a
  user's ``null`` content, which the API does not allow, stays an error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from oxillama.errors import TemplateError
from oxillama.text.chat_template import ChatTemplate

__all__ = [
    "alternates_roles",
    "has_null_content",
    "history_for_template",
    "joined_turns",
    "native_message",
    "plain_message",
    "render_history",
    "renders_tool_calls",
    "renders_tool_role",
    "without_null_content",
]


def _arguments(fn: Mapping[str, Any]) -> Any:
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            return args
    return args


def native_message(m: Mapping[str, Any]) -> dict[str, Any]:
    """``m`` for a template that renders tools: each call's arguments as a
    mapping (OpenAI sends a JSON string), its ``function`` fields also at
    the call's top level (some templates read ``call.name``)."""
    calls = m.get("tool_calls")
    if not isinstance(calls, list):
        return dict(m)
    out = []
    for c in calls:
        if not isinstance(c, Mapping):
            out.append(c)
            continue
        fn = dict(c.get("function") or {})
        if "arguments" in fn:
            fn["arguments"] = _arguments(fn)
        out.append({**c, "function": fn, **fn})
    return {**m, "tool_calls": out}


def plain_message(m: Mapping[str, Any], *, tool_role: bool = True) -> dict[str, Any]:
    """``m`` for a template without tools: earlier calls become the text
    the model was asked to write, and a ``null`` content is empty; without
    a ``tool`` role in the template (``tool_role`` false), a tool's result
    is a user turn holding a ``<tool_response>`` block."""
    if m.get("role") == "tool" and not tool_role:
        return {
            "role": "user",
            "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>",
        }
    calls = m.get("tool_calls")
    if isinstance(calls, list) and calls:
        blocks = []
        for c in calls:
            fn = c.get("function", {}) if isinstance(c, Mapping) else {}
            call = json.dumps(
                {"name": fn.get("name"), "arguments": _arguments(fn)}, ensure_ascii=False
            )
            blocks.append(f"<tool_call>\n{call}\n</tool_call>")
        text = m.get("content") or ""
        return {"role": m["role"], "content": text + ("\n" if text else "") + "\n".join(blocks)}
    if _null_assistant(m):
        return {**m, "content": ""}
    return dict(m)


def renders_tool_calls(source: str | None) -> bool:
    """Whether the template reads an assistant turn's ``tool_calls``."""
    return source is not None and "tool_calls" in source


def renders_tool_role(source: str | None) -> bool:
    """Whether the template names the ``tool`` role."""
    return source is not None and ("'tool'" in source or '"tool"' in source)


def alternates_roles(source: str | None) -> bool:
    """Whether the template refuses two turns of one role in a row."""
    return source is not None and "must alternate" in source


def joined_turns(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each run of user (or assistant) turns with text
    content joined into one turn, the texts separated by a blank line."""
    out: list[dict[str, Any]] = []
    for m in messages:
        prev = out[-1] if out else None
        if (
            prev is not None
            and m.get("role") in ("user", "assistant")
            and prev.get("role") == m.get("role")
            and isinstance(prev.get("content"), str)
            and isinstance(m.get("content"), str)
        ):
            prev["content"] = "\n\n".join(t for t in (prev["content"], m["content"]) if t)
        else:
            out.append(dict(m))
    return out


def history_for_template(
    messages: Sequence[Mapping[str, Any]], source: str | None
) -> list[dict[str, Any]]:
    """``messages`` as the template whose Jinja source is ``source``
    renders them (see the module's notes)."""
    if renders_tool_calls(source):
        return [native_message(m) for m in messages]
    role = renders_tool_role(source)
    plain = [plain_message(m, tool_role=role) for m in messages]
    return joined_turns(plain) if alternates_roles(source) else plain


def _null_assistant(m: Mapping[str, Any]) -> bool:
    # The API allows a null content on an assistant turn only (beside its
    # tool calls); a user's null content stays the error it is.
    return m.get("role") == "assistant" and "content" in m and m["content"] is None


def has_null_content(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether some assistant turn's ``content`` is ``None``."""
    return any(isinstance(m, Mapping) and _null_assistant(m) for m in messages)


def without_null_content(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with every assistant turn's ``None`` content as ``""``:
    for templates that concatenate content and fail on ``None``."""
    return [{**m, "content": ""} if _null_assistant(m) else dict(m) for m in messages]


def render_history(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> str:
    """``template``'s prompt for ``messages``, whatever tool calls and
    results they hold: :func:`history_for_template`, then, if the template
    fails on a ``null`` content, the same with ``""`` (a template that
    concatenates content cannot take ``None``; one that tests it can)."""
    history = history_for_template(messages, template.source)
    try:
        return template.render(history, add_generation_prompt=add_generation_prompt, **kwargs)
    except TemplateError:
        if not has_null_content(history):
            raise
    return template.render(
        without_null_content(history), add_generation_prompt=add_generation_prompt, **kwargs
    )
