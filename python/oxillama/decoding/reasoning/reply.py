"""How a chat reply comes apart, decided once per call and applied to the
finished :class:`~oxillama.Completion` by every chat front door
(``Engine.chat``, ``AsyncEngine.chat``, ``AsyncSession.chat`` and their
streaming forms), so that all of them give the same split:

- a model whose template speaks harmony (gpt-oss): by channel, unless
  ``reasoning_format`` is ``"none"``;
- a thinking model (``"auto"`` and the markers, or ``"deepseek"``): its
  ``<think>`` reasoning apart from the answer;
- otherwise not at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from oxillama.decoding.completion import Completion
from oxillama.decoding.reasoning.harmony import parse_harmony, speaks_harmony
from oxillama.decoding.reasoning.splitter import (
    ReasoningFormat,
    check_reasoning,
    opens_reasoning,
    split_reasoning,
    thinks,
)

__all__ = ["ReplySplit"]


@dataclass(frozen=True)
class ReplySplit:
    """How one reply is split: ``"harmony"``, ``"think"`` (``inside``: the
    prompt opened the reasoning) or ``"none"``."""

    kind: Literal["harmony", "think", "none"]
    inside: bool = False

    @classmethod
    def choose(
        cls,
        reasoning_format: ReasoningFormat,
        template: str | None,
        tokenize: Callable[[str], list[int]],
        prompt: str,
    ) -> ReplySplit:
        """The split for a reply to the rendered ``prompt``; an unknown
        ``reasoning_format`` is refused by name."""
        check_reasoning(reasoning_format, -1)
        if reasoning_format == "none":
            return cls("none")
        if speaks_harmony(template):
            return cls("harmony")
        if reasoning_format == "auto" and not thinks(template, tokenize):
            return cls("none")
        return cls("think", opens_reasoning(prompt))

    def apply(self, done: Completion) -> Completion:
        """``done`` with its text split into ``text``, ``reasoning`` and
        ``tool_calls``."""
        if self.kind == "harmony":
            h = parse_harmony(done.text)
            return dataclasses.replace(
                done, text=h.content, reasoning=h.reasoning or None, tool_calls=tuple(h.calls)
            )
        if self.kind == "think":
            reasoning, answer = split_reasoning(done.text, inside=self.inside)
            return dataclasses.replace(done, text=answer, reasoning=reasoning)
        return done
