"""A harmony reply (gpt-oss) on ``/v1/chat/completions``: its ``analysis``
messages as ``reasoning_content``, its ``final`` ones as ``content`` and
its ``commentary`` calls to functions as ``tool_calls``, streamed or
whole."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from oxillama.decoding.reasoning import HarmonyDelta, HarmonyParser, parse_harmony
from oxillama.decoding.tool_calls import ToolCall
from oxillama.serving.http.tools import call_json

__all__ = ["HarmonyChoice"]


@dataclass
class HarmonyChoice:
    """One choice's channels, split as its text streams."""

    parser: HarmonyParser = field(default_factory=HarmonyParser)
    calls: list[ToolCall] = field(default_factory=list)

    def delta(self, piece: str) -> dict[str, Any]:
        """A stream chunk's ``delta`` for ``piece``."""
        return self._delta(self.parser.feed(piece))

    def end(self, piece: str) -> dict[str, Any]:
        """The last ``delta``: ``piece``, then whatever was held back."""
        d = self.parser.feed(piece)
        d += self.parser.finish()
        return self._delta(d)

    def _delta(self, d: HarmonyDelta) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if d.reasoning:
            out["reasoning_content"] = d.reasoning
        if d.content:
            out["content"] = d.content
        if d.calls:
            out["tool_calls"] = [
                {"index": len(self.calls) + k, **call_json(c)} for k, c in enumerate(d.calls)
            ]
            self.calls += d.calls
        return out

    def message(self, text: str) -> dict[str, Any]:
        """The whole reply as OpenAI's assistant message."""
        d = parse_harmony(text)
        self.calls = list(d.calls)
        msg: dict[str, Any] = {"role": "assistant", "content": d.content}
        if d.reasoning:
            msg["reasoning_content"] = d.reasoning
        if d.calls:
            msg["content"] = d.content if d.content.strip() else None
            msg["tool_calls"] = [call_json(c) for c in d.calls]
        return msg
