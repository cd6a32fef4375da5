"""A cap on a reply's reasoning, in tokens (Anthropic's
``thinking.budget_tokens``; llama.cpp's ``--reasoning-budget N``).

The reply's tokens are counted from its start (a ``<think>`` it writes
itself included). When it has written the cap's number and is still
inside its reasoning (opened by the prompt or by its own ``<think>``, not
closed yet), the text the templates write after a reasoning block,
``"\\n</think>\\n\\n"``, is forced token by token, and the reply goes on
to its answer from there, within the request's ``max_tokens``. A reply
that closes its reasoning in time, or never opens one, is left alone.
While a grammar applies (one from the first token, or a lazy tool-call
grammar that has started), the close waits for it: the grammar decides
the text, and a tool call under way is not cut.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from oxillama.decoding.reasoning.splitter import END, START
from oxillama.errors import ParameterError

__all__ = ["CLOSE", "ReasoningCap"]

#: What is forced when the cap is reached: the end of a reasoning block as
#: the templates that write one render it (Qwen3's, DeepSeek-R1's).
CLOSE = f"\n{END}\n\n"


@dataclass(frozen=True)
class ReasoningCap:
    """At most ``tokens`` tokens of reasoning; ``close`` is the closing text's
    tokens; ``inside``: the prompt opened the reasoning."""

    tokens: int
    close: tuple[int, ...]
    inside: bool = False

    @classmethod
    def of(cls, tokens: int, tokenize: Callable[[str], list[int]], *, inside: bool) -> ReasoningCap:
        """A cap of ``tokens`` (a positive integer), the close tokenized by
        ``tokenize`` (the markers as the special tokens they may be)."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ParameterError(f"reasoning_budget must be a positive integer, got {tokens!r}")
        return cls(tokens, tuple(tokenize(CLOSE)), inside)

    def due(self, generated: int, text: str) -> tuple[int, ...]:
        """The tokens to force once the reply has ``generated`` tokens whose
        text is ``text``: the close when that reaches the cap inside the
        reasoning, else none."""
        if generated != self.tokens:
            return ()
        opened = self.inside or text.lstrip().startswith(START)
        return self.close if opened and END not in text else ()
