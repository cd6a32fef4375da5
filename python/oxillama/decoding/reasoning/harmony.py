"""Splitting a reply in OpenAI's harmony format (gpt-oss) into its channels.

A harmony reply is a run of messages, each a header and a body::

    <|channel|>analysis<|message|>…reasoning…<|end|>
    <|start|>assistant<|channel|>final<|message|>…answer…
    <|start|>assistant to=functions.weather<|channel|>commentary json<|message|>{"city": "Oslo"}

The prompt ends with ``<|start|>assistant``, so the reply opens inside the
first header. A header names the channel after ``<|channel|>`` and, for a
tool call, the recipient as ``to=functions.NAME`` (before or after the
channel); ``<|message|>`` starts the body, and ``<|end|>`` ends it (the
last message ends with ``<|return|>`` or ``<|call|>``, which stop the
generation and so are usually not in the text).

- ``analysis``: the model's reasoning;
- ``final``: the answer;
- ``commentary`` addressed ``to=`` a function: a tool call whose body is
  its JSON arguments; without a recipient, text for the user (a preamble),
  which is content.

:class:`HarmonyParser` takes the reply piece by piece as it streams,
holding back only what could still be the start of a marker; a tool call
comes out once its body has ended. What does not follow the format (a
header without a known channel, arguments that are not a JSON object,
text between messages) stays in the content as the model wrote it, as
the other tool-call formats keep a call that does not parse.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from oxillama.decoding.tool_calls import ToolCall

__all__ = ["HarmonyDelta", "HarmonyParser", "parse_harmony", "speaks_harmony"]

CHANNEL, MESSAGE, END, START = "<|channel|>", "<|message|>", "<|end|>", "<|start|>"
CONSTRAIN = "<|constrain|>"
# Either ends the last message; both stop the generation, so a reply
# carries them only when it was generated with them kept.
STOPS = ("<|return|>", "<|call|>")
BODY_ENDS = (END, *STOPS)
CHANNELS = ("analysis", "commentary", "final")
FUNCTIONS = "functions."
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=<\||\s|$)")


def speaks_harmony(template: str | None) -> bool:
    """Whether a chat template writes harmony's channel marker."""
    return CHANNEL in (template or "")


@dataclass
class HarmonyDelta:
    """What one piece of a reply completes: reasoning and answer text, and
    tool calls whose arguments have ended."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    def __iadd__(self, other: HarmonyDelta) -> HarmonyDelta:
        self.reasoning += other.reasoning
        self.content += other.content
        self.calls += other.calls
        return self


def _held(buf: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``buf`` that could begin a marker."""
    keep = 0
    for m in markers:
        for k in range(min(len(buf), len(m) - 1), 0, -1):
            if m.startswith(buf[-k:]):
                keep = max(keep, k)
                break
    return keep


@dataclass(frozen=True)
class _Header:
    channel: str | None  # None: no channel we know
    recipient: str | None
    raw: str


def _parse_header(text: str) -> _Header:
    """The channel and recipient of a header (the text between
    ``<|start|>`` and ``<|message|>``, the role included or not)."""
    plain = text.replace(CONSTRAIN, " ")
    at = plain.find(CHANNEL)
    words = plain[at + len(CHANNEL) :].split() if at >= 0 else []
    channel = words[0] if words and words[0] in CHANNELS else None
    m = _RECIPIENT.search(plain)
    return _Header(channel, m.group(1) if m else None, text)


def _call(recipient: str, body: str) -> ToolCall | None:
    """A tool call from a recipient and its JSON body; ``None`` when the
    body is not a JSON object."""
    try:
        args = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(args, dict):
        return None
    name = recipient[len(FUNCTIONS) :] if recipient.startswith(FUNCTIONS) else recipient
    return ToolCall(name, args)


class HarmonyParser:
    """One harmony reply's reasoning, answer and tool calls, piece by piece.
    The reply starts inside the first header (the prompt ended with
    ``<|start|>assistant``)."""

    def __init__(self) -> None:
        self._state = "header"  # "header", "body", "between" or "raw"
        self._buf = ""
        self._header: _Header | None = None
        self._call_body = ""
        self._fresh = False  # nothing of the current body given out yet
        self.calls: list[ToolCall] = []

    def feed(self, piece: str) -> HarmonyDelta:
        """What ``piece`` completes."""
        self._buf += piece
        out = HarmonyDelta()
        while self._step(out):
            pass
        self.calls += out.calls
        return out

    def _step(self, out: HarmonyDelta) -> bool:
        """Consumes what it can; False when it needs more text."""
        if self._state == "raw":
            out.content += self._buf
            self._buf = ""
            return False
        if self._state == "between":
            # After a message: only the next message's <|start|> may follow.
            head = self._buf.lstrip()
            if head.startswith(START):
                self._buf, self._state = head[len(START) :], "header"
                return True
            if START.startswith(head):
                return False
            self._state = "raw"  # not harmony from here: all content
            return True
        if self._state == "header":
            at = self._buf.find(MESSAGE)
            if at < 0:
                return False
            self._header = _parse_header(self._buf[:at])
            self._buf, self._state = self._buf[at + len(MESSAGE) :], "body"
            self._call_body, self._fresh = "", True
            return True
        ends = [(i, m) for m in BODY_ENDS if (i := self._buf.find(m)) >= 0]
        if ends:
            i, marker = min(ends)
            self._emit(self._buf[:i], out, done=True)
            self._buf, self._state = self._buf[i + len(marker) :], "between"
            return True
        keep = _held(self._buf, BODY_ENDS)
        self._emit(self._buf[: len(self._buf) - keep], out, done=False)
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _emit(self, text: str, out: HarmonyDelta, *, done: bool) -> None:
        h = self._header
        assert h is not None
        if h.channel is None:
            # Not a channel we know: the message as written is content.
            if self._fresh:
                text = START + h.raw + MESSAGE + text
            self._fresh = False
            out.content += text
            return
        if h.recipient is not None:
            self._call_body += text
            if done:
                call = _call(h.recipient, self._call_body)
                if call is not None:
                    out.calls.append(call)
                else:
                    out.content += START + h.raw + MESSAGE + self._call_body
            return
        if h.channel == "analysis":
            out.reasoning += text
        else:
            out.content += text

    def finish(self) -> HarmonyDelta:
        """The end of the reply: a body cut by ``max_tokens`` (or stopped by
        ``<|return|>`` / ``<|call|>``) ends here. A header cut short gives
        nothing more; text that never became a header (a reply not in
        harmony at all) is content."""
        out = HarmonyDelta()
        if self._state == "body":
            self._emit(self._buf, out, done=True)
        elif self._state == "raw" or (self._state == "header" and CHANNEL not in self._buf):
            out.content += self._buf
        self._buf, self._state = "", "between"
        self.calls += out.calls
        return out


def parse_harmony(text: str) -> HarmonyDelta:
    """A whole harmony reply's reasoning, answer and tool calls."""
    p = HarmonyParser()
    out = p.feed(text)
    out += p.finish()
    return out
