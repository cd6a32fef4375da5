"""One reply as Anthropic's content blocks: thinking, then text and
tool_use blocks in the order the model wrote them, built piece by piece so
that a stream's events and a whole reply's ``content`` are the same
blocks.

Each piece goes through the reasoning splitter (what lies between
``<think>`` and ``</think>`` is thinking), then the tool-call detector
(a call is a ``tool_use`` block; the text around calls is ``text``).
Blank text is held back until something visible follows, so a reply that
is only a call has no empty text block before it."""

from __future__ import annotations

import secrets
from typing import Any

from oxillama.decoding.reasoning import ReasoningSplitter
from oxillama.decoding.tool_calls import ToolCall, ToolCallDetector, ToolFormat

__all__ = ["Blocks", "tool_use_id"]

Event = dict[str, Any]


def tool_use_id() -> str:
    """A fresh ``tool_use`` id, in Anthropic's ``toolu_`` style."""
    return "toolu_" + secrets.token_hex(12)


class Blocks:
    """A reply's content blocks. ``split``: the reply's reasoning splitter
    (None when replies are not split); ``fmt``: the tool-call syntax to find
    (None without tools); ``single``: keep only the first call
    (``disable_parallel_tool_use``); ``omit_thinking``: thinking blocks
    carry no text (``thinking.display: "omitted"``)."""

    def __init__(
        self,
        split: ReasoningSplitter | None,
        fmt: ToolFormat | None,
        *,
        single: bool = False,
        omit_thinking: bool = False,
    ) -> None:
        self.split = split
        self.detector = ToolCallDetector(fmt) if fmt is not None else None
        self.single = single
        self.omit_thinking = omit_thinking
        #: The blocks so far, the last one possibly still open.
        self.content: list[dict[str, Any]] = []
        self.calls = 0
        self._open = False
        self._blank = ""

    def feed(self, piece: str) -> list[Event]:
        """The stream events ``piece`` completes."""
        reasoning, text = self.split.feed(piece) if self.split is not None else ("", piece)
        return self._route(reasoning, text, final=False)

    def finish(self) -> list[Event]:
        """The events of what was held back, and the last block's end."""
        reasoning, text = self.split.finish() if self.split is not None else ("", "")
        events = self._route(reasoning, text, final=True)
        events += self._close()
        return events

    # ---------------------------------------------------------------- inner

    def _route(self, reasoning: str, text: str, *, final: bool) -> list[Event]:
        events: list[Event] = []
        if reasoning:
            events += self._append("thinking", reasoning)
        if self.detector is None:
            events += self._append("text", text)
            return events
        found = self.detector.feed(text) if text else []
        events += self._append("text", self.detector.take_content())
        for call in found:
            events += self._tool_use(call)
        if final:
            events += self._append("text", self.detector.finish())
        return events

    def _append(self, kind: str, text: str) -> list[Event]:
        if not text:
            return []
        last = self.content[-1] if self._open else None
        if last is None or last["type"] != kind:
            if kind == "text" and not (self._blank + text).strip():
                self._blank += text
                return []
            if kind == "text":
                text, self._blank = self._blank + text, ""
            events = self._close()
            block = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            events += self._start(block)
        else:
            events = []
        if kind == "thinking" and self.omit_thinking:
            return events
        last = self.content[-1]
        last[kind] += text
        delta = (
            {"type": "thinking_delta", "thinking": text}
            if kind == "thinking"
            else {"type": "text_delta", "text": text}
        )
        events.append(
            {"type": "content_block_delta", "index": len(self.content) - 1, "delta": delta}
        )
        return events

    def _tool_use(self, call: ToolCall) -> list[Event]:
        if self.single and self.calls:
            return []
        self.calls += 1
        events = self._close()
        events += self._start({"type": "tool_use", "id": tool_use_id(), "name": call.name})
        self.content[-1]["input"] = call.arguments
        events.append(
            {
                "type": "content_block_delta",
                "index": len(self.content) - 1,
                "delta": {"type": "input_json_delta", "partial_json": call.arguments_json()},
            }
        )
        events += self._close()
        return events

    def _start(self, block: dict[str, Any]) -> list[Event]:
        self.content.append(block)
        self._open = True
        shown = {**block, "input": {}} if block["type"] == "tool_use" else dict(block)
        return [
            {"type": "content_block_start", "index": len(self.content) - 1, "content_block": shown}
        ]

    def _close(self) -> list[Event]:
        if not self._open:
            return []
        self._open = False
        return [{"type": "content_block_stop", "index": len(self.content) - 1}]
