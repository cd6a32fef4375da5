"""Which tool-call format a chat template speaks, and the instructions
given to a model whose template knows nothing of tools."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from oxillama.decoding.tool_calls.detector import ToolFormat

__all__ = ["format_for_template", "takes_tools", "tools_instructions"]


def takes_tools(source: str | None) -> bool:
    """Whether the template renders a ``tools`` variable."""
    return source is not None and "tools" in source


def format_for_template(source: str | None) -> ToolFormat:
    """The call syntax the template's model was trained on, read from the
    markers the template writes; Hermes-style ``<tool_call>`` otherwise
    (what :func:`tools_instructions` asks for)."""
    src = source or ""
    if "[TOOL_CALLS]" in src:
        return "mistral"
    if "<|python_tag|>" in src or "ipython" in src:
        return "llama3"
    return "qwen"


def tools_instructions(tools: Sequence[Mapping[str, Any]]) -> str:
    """A system-prompt section describing ``tools`` (OpenAI's
    ``{"type": "function", "function": {...}}`` entries) and the
    ``<tool_call>`` syntax, for templates without tool support."""
    lines = [
        "You may call these functions. Each is described by a JSON Schema:",
        "<tools>",
        *(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools),
        "</tools>",
        "To call a function, reply with one block per call:",
        '<tool_call>\n{"name": <function name>, "arguments": <arguments object>}\n</tool_call>',
    ]
    return "\n".join(lines)
