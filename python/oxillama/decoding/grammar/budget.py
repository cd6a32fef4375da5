"""Constrained output that still ends inside ``max_tokens``.

A sampled token is kept only if the grammar can still be finished in the
tokens left after it: its shortest completion (in bytes), spelled with as
few vocabulary tokens as possible, must fit. Otherwise the token is drawn
again from the tokens that start that completion and keep it within the
budget, which brings the end one step closer each time. So a document
that fits is always completed; without this, a JSON Schema generation that
runs out of tokens returns JSON cut in the middle.

A grammar that is a run of items (parallel tool calls) is also held to
whole items: where one item has ended, the next is begun only when the
tokens left cover the longest item written so far; otherwise the grammar is
finished right there (:class:`Items`). Squeezing a further item into the
tokens left would give a call with its arguments cut to their shortest
valid form, and a reply that reports ``length`` although every call the
model meant to write is complete.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

import oxillama._native as _native
from oxillama.errors import GenerateError

if TYPE_CHECKING:
    from oxillama.decoding.grammar import Grammar

__all__ = ["Items", "sample_within_budget"]


def _padded(mask: bytes, vocab_size: int) -> bytes:
    need = (vocab_size + 7) // 8
    return mask if len(mask) >= need else mask.ljust(need, b"\0")


class Items:
    """One generation's item sizes under a grammar that is a run of items
    (its :attr:`~oxillama.Grammar.item_end` is set).

    An item ends where the grammar could be finished in at most
    ``item_end`` bytes (0 where it may end outright, 1 before a closing
    ``]``); the first item starts with the generation, each later one with
    the token that leaves such a state."""

    def __init__(self, item_end: int) -> None:
        self.item_end = item_end
        #: ``left`` when the open item began (None: between items).
        self.start: int | None = None
        self.longest = 0

    @classmethod
    def of(cls, grammar: Grammar | None) -> Items | None:
        """Fresh tracking for a generation under ``grammar``; None unless
        it is a run of items."""
        end = None if grammar is None else grammar.item_end
        return None if end is None else cls(end)

    def between(self, matcher: _native.GrammarMatcher) -> bool:
        """Whether ``matcher`` stands where an item has ended."""
        need = matcher.min_completion_bytes()
        return need is not None and need <= self.item_end

    def step(self, matcher: _native.GrammarMatcher, left: int) -> bool:
        """Before a token is sampled with ``left`` tokens to go: closes the
        item that just ended (noting its size); True between items."""
        if not self.between(matcher):
            if self.start is None:
                self.start = left
            return False
        if self.start is not None:
            self.longest = max(self.longest, self.start - left)
            self.start = None
        return True


def _finish_here(
    sampler: _native.Sampler,
    matcher: _native.GrammarMatcher,
    logits: npt.NDArray[np.float32],
    vocab_size: int,
    left: int,
) -> int | None:
    """Samples a token that finishes the grammar along its shortest path
    (the end of generation where it may end); None when none spells out."""
    path = matcher.shortest_path_mask(left)
    if path is None:
        return None
    tok = int(sampler.sample(logits, _padded(path, vocab_size)))
    if not matcher.accept_token(tok):
        raise GenerateError(f"internal error: budget token {tok} the grammar refuses")
    return tok


def sample_within_budget(
    sampler: _native.Sampler,
    matcher: _native.GrammarMatcher,
    logits: npt.NDArray[np.float32],
    allowed: bytes,
    vocab_size: int,
    left: int,
    items: Items | None = None,
) -> tuple[int, bool]:
    """Samples under ``allowed`` and advances ``matcher`` by the token; when
    ``left`` (tokens that may still be generated, this one included) would
    no longer fit the grammar's shortest completion, samples again from the
    shortest-completion tokens. Returns the token and whether the budget
    chose it.

    With ``items`` (a grammar that is a run of items), a token that would
    begin another item is kept only when ``left`` covers the longest item
    so far and the new item's shortest completion; otherwise the grammar is
    finished where it stands, which is an ordinary end (not the budget
    cutting an item short)."""
    between = items is not None and items.step(matcher, left)
    tok = int(sampler.sample(logits, allowed))
    if not matcher.accept_token(tok):
        raise GenerateError(f"internal error: sampled token {tok} the grammar refuses")
    if items is not None and between and not items.between(matcher):
        need = matcher.min_completion_tokens()
        if need is None or left < max(items.longest, need + 1):
            matcher.rollback(1)
            end = _finish_here(sampler, matcher, logits, vocab_size, left)
            if end is not None:
                return end, False
            matcher.accept_token(tok)
        items.start = left
    # Bytes bound tokens from above (single-byte tokens spell anything), so
    # the usual case is settled without spelling a completion out.
    bytes_needed = matcher.min_completion_bytes()
    if bytes_needed is None or bytes_needed <= left - 1:
        return tok, False
    need = matcher.min_completion_tokens()
    if need is None or need <= left - 1:
        return tok, False
    matcher.rollback(1)
    end = _finish_here(sampler, matcher, logits, vocab_size, left)
    if end is None:
        # Not spelled as text from here (mid-character): keep the draw.
        matcher.accept_token(tok)
        return tok, False
    return end, True
