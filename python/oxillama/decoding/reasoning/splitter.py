"""Splitting a reply into its reasoning and its answer.

A thinking model opens its reply with ``<think>``, reasons, closes with
``</think>`` and answers; templates such as Qwen3's and DeepSeek-R1's
open the ``<think>`` themselves at the end of the prompt, so the reply
starts inside the reasoning. :class:`ReasoningSplitter` takes the reply
piece by piece (as it streams) and gives each piece's reasoning and
answer parts, holding back only what could still be the start of a
marker. A reply that never closes its reasoning is all reasoning (it was
cut by ``max_tokens``); one that does not open with the marker is all
answer.

Which replies are split (``--reasoning-format``, as llama-server's):

- ``"none"``: never; the markers stay in the content;
- ``"deepseek"``: always;
- ``"auto"``: when the model has the markers, as a special token of its
  vocabulary or in its chat template (:func:`thinks`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

from oxillama.errors import ParameterError

__all__ = [
    "REASONING_FORMATS",
    "ReasoningFormat",
    "ReasoningSplitter",
    "check_reasoning",
    "opens_reasoning",
    "split_reasoning",
    "thinks",
]

ReasoningFormat = Literal["auto", "deepseek", "none"]
REASONING_FORMATS: tuple[str, ...] = get_args(ReasoningFormat)
START, END = "<think>", "</think>"


def check_reasoning(fmt: str, budget: int) -> None:
    """Refuses a format or budget we do not run, by name."""
    if fmt not in REASONING_FORMATS:
        raise ParameterError(f"reasoning format must be one of {REASONING_FORMATS}, not {fmt!r}")
    if budget not in (-1, 0):
        raise ParameterError(
            f"reasoning budget must be -1 (unlimited) or 0 (thinking off), not {budget}"
        )


def thinks(template: str | None, tokenize: Callable[[str], list[int]]) -> bool:
    """Whether a model has the reasoning markers: ``<think>`` is one token
    of its vocabulary, or its chat template writes it."""
    return START in (template or "") or len(tokenize(START)) == 1


def opens_reasoning(prompt: str) -> bool:
    """Whether a rendered prompt ends inside an opened ``<think>`` (the
    template opened it for the model)."""
    return prompt.rstrip().endswith(START)


def _partial(buf: str, marker: str) -> int:
    """Length of the longest suffix of ``buf`` that begins ``marker``."""
    for k in range(min(len(buf), len(marker) - 1), 0, -1):
        if marker.startswith(buf[-k:]):
            return k
    return 0


class ReasoningSplitter:
    """One reply's reasoning and answer, piece by piece. ``inside``: the
    prompt already opened the reasoning (it ends with ``<think>``)."""

    def __init__(self, *, inside: bool = False) -> None:
        self._state = "reasoning" if inside else "start"
        self._buf = ""
        # Blank space right after a marker belongs to neither part.
        self._after_start = True
        self._after_end = False

    def feed(self, piece: str) -> tuple[str, str]:
        """The reasoning and answer text that ``piece`` completes."""
        self._buf += piece
        reasoning, answer = "", ""
        while True:
            if self._state == "start":
                head = self._buf.lstrip()
                if head.startswith(START):
                    self._buf = head[len(START) :]
                    self._state = "reasoning"
                    continue
                if START.startswith(head):  # could still be the marker
                    return reasoning, answer
                self._state = "answer"
                continue
            if self._state == "reasoning":
                if self._after_start:
                    self._buf = self._buf.lstrip()
                    if not self._buf:
                        return reasoning, answer
                    self._after_start = False
                at = self._buf.find(END)
                if at >= 0:
                    reasoning += self._buf[:at]
                    self._buf = self._buf[at + len(END) :]
                    self._state, self._after_end = "answer", True
                    continue
                keep = _partial(self._buf, END)
                reasoning += self._buf[: len(self._buf) - keep]
                self._buf = self._buf[len(self._buf) - keep :]
                return reasoning, answer
            # The answer: the blank lines that follow </think> are not part of it.
            if self._after_end:
                self._buf = self._buf.lstrip()
                if not self._buf:
                    return reasoning, answer
                self._after_end = False
            answer += self._buf
            self._buf = ""
            return reasoning, answer

    def finish(self) -> tuple[str, str]:
        """What is held back, at the end of the reply."""
        buf, self._buf = self._buf, ""
        if self._state == "reasoning":
            return buf, ""
        if self._state == "answer" and self._after_end:
            buf = buf.lstrip()
        return "", buf


def split_reasoning(text: str, *, inside: bool = False) -> tuple[str | None, str]:
    """A whole reply's reasoning (``None`` when it has none) and answer."""
    s = ReasoningSplitter(inside=inside)
    r1, a1 = s.feed(text)
    r2, a2 = s.finish()
    reasoning = r1 + r2
    opened = inside or text.lstrip().startswith(START)
    return (reasoning if opened else None), a1 + a2
