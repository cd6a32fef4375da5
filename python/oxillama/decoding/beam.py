"""Beam search: the ``beam_width`` most likely continuations of a prompt.

Every beam is a KV session on one page pool. The prompt is evaluated
once; each surviving candidate forks its parent's session (the pages are
shared and copied only where the new token is written), and one batched
forward pass advances every live beam per step. A hypothesis's score is
``logprob_sum / len(tokens) ** length_penalty`` (length 1 at least), so
``length_penalty > 1`` favours longer texts and ``0`` ranks by the plain
sum, as in the runtime we model and in HF transformers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

import oxillama._native as _native
from oxillama.errors import ParameterError

__all__ = ["Beam", "BeamSearch", "score"]


@dataclass(frozen=True)
class Beam:
    """One hypothesis, best first in :meth:`Engine.beam_search`'s list."""

    text: str
    tokens: list[int]
    logprob_sum: float
    score: float
    #: Ended by an end-of-generation token (not counted in ``tokens``),
    #: rather than by ``max_tokens``.
    finished: bool


def score(logprob_sum: float, n_tokens: int, length_penalty: float) -> float:
    """The length-penalized score of a hypothesis of ``n_tokens`` tokens."""
    return float(logprob_sum / max(1, n_tokens) ** length_penalty)


def _log_softmax(rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    x = rows.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    out: npt.NDArray[np.float64] = x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))
    return out


@dataclass
class _Live:
    session: _native.Session
    tokens: list[int]
    logprob_sum: float
    logits: npt.NDArray[np.float32]


@dataclass
class _Done:
    tokens: list[int]
    logprob_sum: float
    finished: bool
    score: float = field(init=False)
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        self.score = score(self.logprob_sum, len(self.tokens), self.length_penalty)


def check_args(beam_width: object, max_tokens: object, length_penalty: object) -> None:
    if isinstance(beam_width, bool) or not isinstance(beam_width, int) or beam_width < 1:
        raise ParameterError(f"beam_width must be a positive integer, got {beam_width!r}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ParameterError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    if (
        isinstance(length_penalty, bool)
        or not isinstance(length_penalty, (int, float))
        or not math.isfinite(length_penalty)
    ):
        raise ParameterError(f"length_penalty must be a finite number, got {length_penalty!r}")


class BeamSearch:
    """One search, advanced a step at a time (``AsyncEngine`` runs each step
    on its worker between batched steps; ``Engine`` runs them in a row)."""

    def __init__(
        self,
        root: _native.Session,
        prompt_logits: npt.NDArray[np.float32],
        *,
        is_eog: Callable[[int], bool],
        beam_width: int,
        max_tokens: int,
        length_penalty: float,
        early_stopping: bool,
    ) -> None:
        self.width, self.max_tokens = beam_width, max_tokens
        self.length_penalty, self.early_stopping = float(length_penalty), early_stopping
        self.is_eog = is_eog
        self.live = [_Live(root, [], 0.0, prompt_logits)]
        self.done: list[_Done] = []
        self.steps = 0
        #: Pages the pool lent at most (``pool`` given to :meth:`step`).
        self.peak_pages = 0

    def finished(self) -> bool:
        if not self.live:
            return True
        if len(self.done) < self.width:
            return False
        if self.early_stopping:
            return True
        # No live beam can still beat the worst kept hypothesis: log-probs
        # only fall, so with a non-negative penalty the best a live beam can
        # reach is its score at the longest allowed length.
        worst = min(d.score for d in self.done)
        if self.length_penalty > 0:
            best = max(b.logprob_sum / self.max_tokens**self.length_penalty for b in self.live)
        else:
            best = max(score(b.logprob_sum, len(b.tokens), self.length_penalty) for b in self.live)
        return bool(best <= worst)

    def step(self, pool: _native.KvPool | None = None) -> bool:
        """Expands every live beam by one token; True when the search is over."""
        if self.finished():
            return True
        lps = _log_softmax(np.stack([b.logits for b in self.live]))
        k = 2 * self.width  # enough that width survive even if some end
        cands: list[tuple[float, int, int]] = []
        for i, row in enumerate(lps):
            top = np.argpartition(-row, min(k, row.size - 1))[:k]
            base = self.live[i].logprob_sum
            cands += [(base + float(row[t]), i, int(t)) for t in top]
        # Ties go to the earlier beam and the lower token id: deterministic.
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        chosen: list[tuple[float, int, int]] = []
        for total, i, tok in cands:
            parent = self.live[i]
            if self.is_eog(tok):
                self._keep(_Done(parent.tokens, total, True, self.length_penalty))
                continue
            chosen.append((total, i, tok))
            if len(chosen) == self.width:
                break
        self.steps += 1
        nxt: list[_Live] = []
        for total, i, tok in chosen:
            parent = self.live[i]
            toks = [*parent.tokens, tok]
            if len(toks) >= self.max_tokens:
                self._keep(_Done(toks, total, False, self.length_penalty))
                continue
            nxt.append(
                _Live(parent.session.fork(parent.session.n_past), toks, total, parent.logits)
            )
        if pool is not None:
            self.peak_pages = max(self.peak_pages, pool.n_pages - pool.free_pages)
        self.live = nxt  # the parents' sessions (and their pages) go here
        if nxt:
            rows = _native.eval_batch([b.session for b in nxt], [[b.tokens[-1]] for b in nxt])
            for b, row in zip(nxt, rows, strict=True):
                b.logits = row
            if pool is not None:
                self.peak_pages = max(self.peak_pages, pool.n_pages - pool.free_pages)
        return self.finished()

    def _keep(self, d: _Done) -> None:
        self.done.append(d)
        self.done.sort(key=lambda x: -x.score)
        del self.done[self.width :]

    def results(self, detokenize: Callable[[Sequence[int]], str]) -> list[Beam]:
        """The best ``beam_width`` hypotheses, best first: ended ones, and
        live beams cut where the search stopped."""
        pool = list(self.done)
        pool += [_Done(b.tokens, b.logprob_sum, False, self.length_penalty) for b in self.live]
        pool.sort(key=lambda x: -x.score)
        return [
            Beam(detokenize(d.tokens), d.tokens, d.logprob_sum, d.score, d.finished)
            for d in pool[: self.width]
        ]
