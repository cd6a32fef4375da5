"""A reply as the Responses API's output items, built piece by piece as it
streams, with the events that announce each step.

The reply's text goes through the reasoning splitter (a thinking model's
``<think>`` part becomes a ``reasoning`` item) and the tool-call detector
(each call becomes a ``function_call`` item); what is left is the
``message`` item's ``output_text``. A whole reply (not streamed) is fed in
one piece and the events are dropped, so both give the same items."""

from __future__ import annotations

import secrets
from typing import Any

from oxillama.decoding.reasoning import ReasoningSplitter
from oxillama.decoding.tool_calls import ToolCall
from oxillama.serving.http.tools import ChoiceCalls

__all__ = ["OutputItems"]

Event = dict[str, Any]
Item = dict[str, Any]


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


class OutputItems:
    """The output items of one reply and the events of their making.
    ``splitter`` splits off reasoning (None: the model does not reason);
    ``calls`` finds tool calls (None: the request offers no tools)."""

    def __init__(self, splitter: ReasoningSplitter | None, calls: ChoiceCalls | None) -> None:
        self.splitter = splitter
        self.calls = calls
        self.items: list[Item] = []
        #: The item receiving text ("reasoning" or "message"), if any.
        self._open: Item | None = None
        #: Blank text not yet given to a message: a reply that is only
        #: tool calls gets no message for the space around them.
        self._blank = ""

    # ------------------------------------------------------------- feeding

    def feed(self, piece: str) -> list[Event]:
        """The events ``piece`` completes."""
        reasoning, answer = self.splitter.feed(piece) if self.splitter else ("", piece)
        return self._take(reasoning, answer, end=False)

    def finish(self, incomplete: bool) -> list[Event]:
        """The last events: what was held back, then every open item done
        (``incomplete``: the reply was cut by ``max_output_tokens``)."""
        reasoning, answer = self.splitter.finish() if self.splitter else ("", "")
        events = self._take(reasoning, answer, end=True)
        if not any(i["type"] != "reasoning" for i in self.items):
            # A reply with no text and no call still has its (empty) message.
            events += self._close(False)
            events += self._start("message")
        events += self._close(incomplete)
        return events

    def _take(self, reasoning: str, answer: str, *, end: bool) -> list[Event]:
        events: list[Event] = []
        if reasoning:
            events += self._text("reasoning", reasoning)
        content = answer
        new: list[ToolCall] = []
        if self.calls is not None:
            d = self.calls.delta(answer) if answer else {}
            if end:
                for k, v in self.calls.end().items():
                    d[k] = d.get(k, [] if k == "tool_calls" else "") + v
            content = d.get("content", "")
            new = self.calls.calls[len(self.calls.calls) - len(d.get("tool_calls", [])) :]
        if content:
            events += self._text("message", content)
        for call in new:
            events += self._close(False)
            events += self._call(call)
        return events

    # --------------------------------------------------------------- items

    def _text(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if kind == "message" and (self._open is None or self._open["type"] != "message"):
            if not (self._blank + text).strip():
                self._blank += text
                return events
            text, self._blank = self._blank + text, ""
        if self._open is None or self._open["type"] != kind:
            events += self._close(False)
            events += self._start(kind)
        item = self._open
        assert item is not None
        item["content"][0]["text"] += text
        delta = (
            "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        )
        ev: Event = {
            "type": delta,
            "item_id": item["id"],
            "output_index": len(self.items) - 1,
            "content_index": 0,
            "delta": text,
        }
        if kind == "message":
            ev["logprobs"] = []
        events.append(ev)
        return events

    def _start(self, kind: str) -> list[Event]:
        if kind == "message":
            item: Item = {
                "id": _id("msg"),
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            part: Item = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = {
                "id": _id("rs"),
                "type": "reasoning",
                "summary": [],
                "content": [],
                "status": "in_progress",
            }
            part = {"type": "reasoning_text", "text": ""}
        self.items.append(item)
        index = len(self.items) - 1
        added = {"type": "response.output_item.added", "output_index": index, "item": _copy(item)}
        item["content"].append(part)
        self._open = item
        return [
            added,
            {
                "type": "response.content_part.added",
                "item_id": item["id"],
                "output_index": index,
                "content_index": 0,
                "part": dict(part),
            },
        ]

    def _close(self, incomplete: bool) -> list[Event]:
        item, self._open = self._open, None
        if item is None:
            return []
        index = self.items.index(item)
        item["status"] = "incomplete" if incomplete else "completed"
        part = item["content"][0]
        done = (
            "response.output_text.done"
            if item["type"] == "message"
            else "response.reasoning_text.done"
        )
        ev: Event = {
            "type": done,
            "item_id": item["id"],
            "output_index": index,
            "content_index": 0,
            "text": part["text"],
        }
        if item["type"] == "message":
            ev["logprobs"] = []
        return [
            ev,
            {
                "type": "response.content_part.done",
                "item_id": item["id"],
                "output_index": index,
                "content_index": 0,
                "part": dict(part),
            },
            {"type": "response.output_item.done", "output_index": index, "item": _copy(item)},
        ]

    def _call(self, call: ToolCall) -> list[Event]:
        args = call.arguments_json()
        item: Item = {
            "id": _id("fc"),
            "type": "function_call",
            "call_id": call.id,
            "name": call.name,
            "arguments": "",
            "status": "in_progress",
        }
        self.items.append(item)
        index = len(self.items) - 1
        added = {"type": "response.output_item.added", "output_index": index, "item": dict(item)}
        item["arguments"], item["status"] = args, "completed"
        return [
            added,
            {
                "type": "response.function_call_arguments.delta",
                "item_id": item["id"],
                "output_index": index,
                "delta": args,
            },
            {
                "type": "response.function_call_arguments.done",
                "item_id": item["id"],
                "output_index": index,
                "name": call.name,
                "arguments": args,
            },
            {"type": "response.output_item.done", "output_index": index, "item": dict(item)},
        ]

    # -------------------------------------------------------------- result

    @property
    def reasoning(self) -> str:
        return "".join(i["content"][0]["text"] for i in self.items if i["type"] == "reasoning")

    def assistant_turns(self) -> list[dict[str, Any]]:
        """The reply as the chat messages a later turn renders: its text
        and its calls in one assistant turn (reasoning left out, as chat
        clients send a reply back)."""
        text = "".join(i["content"][0]["text"] for i in self.items if i["type"] == "message")
        calls = [
            {
                "id": i["call_id"],
                "type": "function",
                "function": {"name": i["name"], "arguments": i["arguments"]},
            }
            for i in self.items
            if i["type"] == "function_call"
        ]
        msg: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            msg["content"] = text or None
            msg["tool_calls"] = calls
        return [msg]


def _copy(item: Item) -> Item:
    out = dict(item)
    if "content" in out:
        out["content"] = [dict(p) for p in out["content"]]
    return out
