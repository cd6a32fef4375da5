"""``tools`` and ``tool_choice`` on ``/v1/chat/completions``: what the
template is given, the grammar a required call runs under, and the calls
found in each choice's text (plain and streamed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from oxillama.decoding.grammar import Grammar
from oxillama.decoding.tool_calls import ToolCall, ToolCallDetector, ToolFormat
from oxillama.decoding.tool_calls.grammar import call_grammar, lazy_call_grammar
from oxillama.decoding.tool_calls.history import native_message, plain_message
from oxillama.decoding.tool_calls.templates import (
    format_for_template,
    takes_tools,
    tools_instructions,
)
from oxillama.errors import OxiLlamaError
from oxillama.serving.http.api_error import ApiError

__all__ = ["ChoiceCalls", "ToolRequest", "call_json", "tool_request"]


@dataclass(frozen=True)
class ToolRequest:
    tools: list[dict[str, Any]]
    #: "auto", "required", or the one function's name.
    choice: str
    fmt: ToolFormat
    #: The template renders ``tools`` itself (else the system prompt says).
    native: bool
    grammar: Grammar | None
    #: For ``"auto"`` with strict tools: the call-opening marker and the
    #: grammar that applies from it on (the reply may still be text).
    lazy: tuple[str, Grammar] | None = None

    @property
    def constrained(self) -> bool:
        """The call runs under a grammar of its own (required, named or
        strict tools), which leaves no room for another."""
        return self.grammar is not None or self.lazy is not None

    def grammar_kwargs(self) -> dict[str, Any]:
        """The generation keywords of that grammar: it applies at once, or
        (strict tools with ``"auto"``) from its trigger on; a session turn
        takes them as a one-shot request does."""
        if self.lazy is not None:
            trigger, grammar = self.lazy
            return {"grammar_trigger": trigger, "grammar": grammar}
        return {} if self.grammar is None else {"grammar": self.grammar}

    def template_input(
        self, messages: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The messages and template variables to render."""
        if self.native:
            return [native_message(m) for m in messages], {"tools": self.tools}
        msgs = [plain_message(m) for m in messages]
        note = tools_instructions(self.tools)
        if msgs and msgs[0].get("role") == "system":
            msgs[0] = {**msgs[0], "content": f"{msgs[0].get('content') or ''}\n\n{note}"}
        else:
            msgs.insert(0, {"role": "system", "content": note})
        return msgs, {}


def tool_request(
    body: Mapping[str, Any], template: str | None, fmt: ToolFormat | None
) -> ToolRequest | None:
    """The request's tools, checked; None when it offers none or says
    ``tool_choice: "none"``."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    if not tools:
        if choice not in (None, "none"):
            raise ApiError(400, "tool_choice needs tools", param="tool_choice")
        return None
    if choice == "none":
        return None
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise ApiError(400, "two tools have the same name", param="tools")
    if isinstance(choice, Mapping):
        choice = choice["function"]["name"]
        if choice not in names:
            raise ApiError(
                400,
                f"tool_choice names '{choice}', which is not among the tools",
                param="tool_choice",
            )
    choice = choice or "auto"
    strict = any(t["function"].get("strict") for t in tools)
    form = fmt or format_for_template(template)
    grammar = None
    lazy = None
    if strict and choice == "auto":
        try:
            lazy = lazy_call_grammar(tools, form)
        except OxiLlamaError as e:
            raise ApiError(400, f"tools: {e}", param="tools") from e
    if choice != "auto":
        try:
            grammar = call_grammar(
                tools,
                form,
                only=None if choice == "required" else choice,
                # A named function is one call (OpenAI's forced call);
                # "required" may call several unless the request says not.
                parallel=choice == "required" and body.get("parallel_tool_calls") is not False,
            )
        except OxiLlamaError as e:
            raise ApiError(400, f"tools: {e}", param="tools") from e
    return ToolRequest(list(tools), choice, form, takes_tools(template), grammar, lazy)


@dataclass
class ChoiceCalls:
    """One choice's calls, found as its text streams."""

    fmt: ToolFormat
    detector: ToolCallDetector = field(init=False)
    calls: list[ToolCall] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.detector = ToolCallDetector(self.fmt)

    def delta(self, piece: str) -> dict[str, Any]:
        """A stream chunk's ``delta`` for ``piece``."""
        new = self.detector.feed(piece)
        return self._delta(self.detector.take_content(), new)

    def end(self) -> dict[str, Any]:
        """The last ``delta``: whatever content was held back."""
        return self._delta(self.detector.finish(), [])

    def _delta(self, content: str, new: Sequence[ToolCall]) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if content:
            d["content"] = content
        if new:
            d["tool_calls"] = [
                {"index": len(self.calls) + k, **call_json(c)} for k, c in enumerate(new)
            ]
            self.calls += new
        return d

    def message(self, text: str) -> dict[str, Any]:
        """The whole reply as OpenAI's assistant message."""
        self.detector.feed(text)
        content = self.detector.finish()
        self.calls = list(self.detector.calls)
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if self.calls:
            msg["content"] = content if content.strip() else None
            msg["tool_calls"] = [call_json(c) for c in self.calls]
        return msg


def call_json(c: ToolCall) -> dict[str, Any]:
    """A call as an entry of OpenAI's ``tool_calls``."""
    return {
        "id": c.id,
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments_json()},
    }
