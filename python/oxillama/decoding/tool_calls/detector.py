"""Finding tool calls in generated text as it streams.

A format is an opening marker, then either a JSON value (an object, or an
array of objects for Mistral) that closes itself, or text up to a closing
marker. The detector is fed text in pieces of any size; a call split
across pieces, even inside a marker, is found once, when it is complete.
Text outside calls is kept as ``content`` and released only when it can no
longer be the start of a marker.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from oxillama.errors import ParameterError

__all__ = ["Custom", "ToolCall", "ToolCallDetector", "ToolFormat"]


@dataclass(frozen=True)
class Custom:
    """A format of your own: a call is ``open`` + JSON object + ``close``."""

    open: str
    close: str

    def __post_init__(self) -> None:
        if not isinstance(self.open, str) or not self.open:
            raise ParameterError("Custom.open must be a non-empty string")
        if not isinstance(self.close, str) or not self.close:
            raise ParameterError("Custom.close must be a non-empty string")


ToolFormat = Literal["llama3", "qwen", "mistral"] | Custom

#: Keys that hold a call's arguments, in the order they are looked for.
ARGUMENT_KEYS = ("arguments", "args", "parameters")


@dataclass(frozen=True)
class ToolCall:
    """One call: the function's ``name`` and its ``arguments`` (a dict)."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class _Spec:
    opens: tuple[str, ...]
    close: str | None  # None: the JSON value closes itself
    array: bool = False  # the value may be a list of calls


def _spec(fmt: ToolFormat) -> _Spec:
    if isinstance(fmt, Custom):
        return _Spec((fmt.open,), fmt.close)
    if fmt == "qwen":  # Hermes-style, as Qwen 2.5/3 templates ask for
        return _Spec(("<tool_call>",), "</tool_call>")
    if fmt == "mistral":
        return _Spec(("[TOOL_CALLS]",), None, array=True)
    if fmt == "llama3":
        # Llama 3.1/3.2 JSON calls: `<|python_tag|>` before the JSON, or
        # (as the 3.2 templates ask) a bare object starting the reply.
        return _Spec(("<|python_tag|>", "{"), None, array=True)
    raise ParameterError(f"unknown tool-call format {fmt!r} (llama3, qwen, mistral or Custom)")


def to_call(obj: Any) -> ToolCall | None:
    """A ``{"name": ..., "arguments" | "args" | "parameters": {...}}``
    object as a call (arguments given as a JSON string are parsed too)."""
    if not isinstance(obj, Mapping) or not isinstance(obj.get("name"), str):
        return None
    if isinstance(obj.get("function"), Mapping):  # OpenAI's own nesting
        return to_call(obj["function"])
    args: Any = {}
    for key in ARGUMENT_KEYS:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], args)


class _JsonEnd:
    """Where a JSON value that starts a text ends: tracks nesting and
    strings character by character, so it can be fed in pieces."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.started = False

    def feed(self, text: str) -> int | None:
        """The index just past the value's end in ``text``, if it ends there."""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
                continue
            if ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
                self.started = True
            elif ch in "}]":
                self.depth -= 1
                if self.started and self.depth <= 0:
                    return i + 1
            elif not self.started and not ch.isspace():
                return i  # not a JSON object or array: the caller gives up
        return None


class ToolCallDetector:
    """Incremental tool-call detection for one generation.

    ``feed(text)`` returns the calls completed by this piece;
    ``take_content()`` returns the text outside calls that is safe to show
    (it holds back what could still be the start of a marker); ``finish()``
    ends the text and returns the rest of the content. A call whose JSON
    does not parse stays in the content, as the model wrote it.
    """

    def __init__(self, format: ToolFormat = "qwen") -> None:
        self.format = format
        self._spec = _spec(format)
        self.reset()

    def reset(self) -> None:
        self._buf = ""  # text not yet classified
        self._content: list[str] = []
        self._released = False  # some non-space content went out already
        self._in_call = False
        self._call = ""  # the current call's text after its marker
        self._marker = ""
        self._json: _JsonEnd | None = None
        self.calls: list[ToolCall] = []

    # ----------------------------------------------------------------- feed

    def feed(self, text: str) -> list[ToolCall]:
        found: list[ToolCall] = []
        self._buf += text
        while self._buf:
            if self._in_call:
                if not self._call_progress(found):
                    break
                continue
            at, marker = self._find_open()
            if at is None:
                keep = self._partial_open_len()
                cut = len(self._buf) - keep
                self._content.append(self._buf[:cut])
                self._buf = self._buf[cut:]
                break
            self._content.append(self._buf[:at])
            self._begin_call(marker)
            # A bare `{` marker is part of the JSON itself.
            self._buf = self._buf[at if marker == "{" else at + len(marker) :]
        self.calls += found
        return found

    def _find_open(self) -> tuple[int | None, str]:
        best: tuple[int | None, str] = (None, "")
        for m in self._spec.opens:
            if m == "{":
                # A bare object counts only at the very start of the reply.
                if not self._has_content() and self._buf.lstrip().startswith("{"):
                    at = len(self._buf) - len(self._buf.lstrip())
                    return at, m
                continue
            i = self._buf.find(m)
            if i >= 0 and (best[0] is None or i < best[0]):
                best = (i, m)
        return best

    def _partial_open_len(self) -> int:
        """How many characters at the end of the buffer could start a marker."""
        keep = 0
        for m in self._spec.opens:
            if m == "{":
                if not self._has_content() and not self._buf.strip():
                    keep = max(keep, len(self._buf))  # still only whitespace
                continue
            for k in range(min(len(m) - 1, len(self._buf)), 0, -1):
                if self._buf.endswith(m[:k]):
                    keep = max(keep, k)
                    break
        return keep

    def _has_content(self) -> bool:
        return self._released or any(c.strip() for c in self._content)

    def _begin_call(self, marker: str) -> None:
        self._in_call, self._call, self._marker = True, "", marker
        self._json = _JsonEnd() if self._spec.close is None else None

    def _call_progress(self, found: list[ToolCall]) -> bool:
        """Consumes buffered call text; False when it needs more input."""
        close = self._spec.close
        if close is None:
            assert self._json is not None
            end = self._json.feed(self._buf)
            if end is None:
                self._call += self._buf
                self._buf = ""
                return False
            body, self._buf = self._call + self._buf[:end], self._buf[end:]
        else:
            joined = self._call + self._buf
            i = joined.find(close)
            if i < 0:
                self._call, self._buf = joined, ""
                return False
            body, self._buf = joined[:i], joined[i + len(close) :]
        self._in_call = False
        calls = self._parse(body)
        if calls is None:  # not a call after all: the text stays content
            self._content.append(
                (self._marker if self._marker != "{" else "")
                + body
                + (close if close is not None else "")
            )
        else:
            found += calls
        return True

    def _parse(self, body: str) -> list[ToolCall] | None:
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            return None
        items = value if (self._spec.array and isinstance(value, list)) else [value]
        calls = [to_call(v) for v in items]
        if not calls or any(c is None for c in calls):
            return None
        return [c for c in calls if c is not None]

    # -------------------------------------------------------------- content

    def take_content(self) -> str:
        """Content released since the last call of this method."""
        out = "".join(self._content)
        self._content.clear()
        self._released = self._released or bool(out.strip())
        return out

    def finish(self) -> str:
        """Ends the text: an unfinished call or held-back text is content."""
        if self._in_call:
            self._content.append(
                (self._marker if self._marker != "{" else "") + self._call + self._buf
            )
        else:
            self._content.append(self._buf)
        self._buf, self._in_call, self._call = "", False, ""
        return self.take_content()
