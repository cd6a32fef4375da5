"""n-gram (prompt-lookup) drafting: the tokens that followed the longest
recent n-gram matching the end of the context are proposed as the next
ones, at no model cost. The target verifies them as it verifies a model's
drafts; a proposal is deterministic (q is one-hot), so a draft is accepted
exactly when the target's own choice at that position is that token.

How many tokens to propose is decided per round from two measured things:
how often proposals of this match length have agreed with the target
(an estimate per n, updated after every round, also on rounds that drafted
nothing, by comparing the proposal with the token the target chose), and
what a forward pass over ``r`` rows costs compared with one decode step
(:func:`row_cost`). The chosen ``k`` maximizes the expected tokens per round
over the cost of the round, and is 0 (a plain decode step) when no ``k``
beats decoding alone.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from oxillama.errors import ParameterError

__all__ = ["NgramCache", "NgramDraft", "NgramState", "best_k", "row_cost"]

#: The cost model of a forward pass over ``r`` rows, in one-token decode
#: steps, per kernel level (``_native.simd_level()``), measured with
#: SmolLM2-135M Q4_1 (``python benches/bench_ngram.py`` prints the table
#: again). ``small``: the cost of 1, 2, ... rows through the tile kernel;
#: past those, the GEMM microkernel, eight tokens to a group: ``first`` for
#: its first four rows, ``per_row`` for each further row and ``per_group``
#: for each further group of eight.
#:
#: - AVX2: up to three rows through the tile (2 rows 1.7 steps, 3 rows
#:   2.25), 4 rows 2.45, every further row about 0.12 more, every further
#:   group about 1.05 more.
#: - AVX-512 VNNI: up to nine rows through the sixteen-rows tile, whose
#:   extra rows cost little next to streaming the weights (2 rows 1.18
#:   steps, 4 rows 1.60, 8 rows 2.52, 9 rows 3.05; 6 and 7 interpolated),
#:   then the GEMM (12 rows 3.58, 16 rows 4.05, 17 rows 4.73; Intel Xeon,
#:   2026-11-27, two runs, after the tile stopped spilling at 8 rows).
_COSTS: dict[str, dict[str, Any]] = {
    "avx2": {"small": (1.0, 1.7, 2.25), "first": 2.45, "per_row": 0.12, "per_group": 1.05},
    "avx512vnni": {
        "small": (1.0, 1.18, 1.40, 1.60, 1.87, 2.09, 2.31, 2.52, 3.05),
        "first": 2.08,
        "per_row": 0.12,
        "per_group": 0.56,
    },
}


@functools.cache
def _costs() -> dict[str, Any]:
    import oxillama._native as _native

    return _COSTS.get(_native.simd_level(), _COSTS["avx2"])


def row_cost(rows: int) -> float:
    c = _costs()
    small = c["small"]
    if rows <= len(small):
        return float(small[max(rows, 1) - 1])
    groups = -(-rows // 8)
    return float(c["first"] + c["per_row"] * (rows - 4) + c["per_group"] * (groups - 1))


#: Agreement assumed for a match length never observed yet: low enough that
#: nothing is drafted before rounds show that proposals agree.
_PRIOR = 0.1
#: Weight of one observation in the running agreement estimates, once
#: there are enough of them. Before that the estimate is the running mean
#: with the prior counted as one observation (weight ``1 / (count + 1)``),
#: so a request that copies its input drafts after two or three agreeing
#: tokens rather than after the dozen an average from the prior needed:
#: replayed on the bench's greedy outputs (its cost model, SmolLM2),
#: grounded tasks 1.86 -> 1.96 tokens per step, the story 1.04 -> 1.04.
_ALPHA = 0.2
#: The observation count old snapshots (which kept no counts) resume with:
#: past the running-mean start.
_SETTLED = 1 << 20


def _weight(count: int) -> float:
    return max(_ALPHA, 1.0 / (count + 1))


def best_k(agree: float, k_max: int, tokens: float = 1.0, rows: int = 1) -> tuple[int, float]:
    """How many drafts to verify, and the tokens they are expected to add.

    A forward pass already holds ``rows`` rows expected to produce
    ``tokens`` tokens (a lone stream: 1 and 1). ``k`` drafts add ``k`` rows
    and ``a + a^2 + ... + a^k`` expected tokens (each draft passes with
    probability ``a`` given the previous one did); the ``k`` chosen
    maximizes tokens per cost of the pass, and is 0 when no ``k`` beats
    the pass without drafts."""
    best, best_rate, best_gain = 0, tokens / row_cost(rows), 0.0
    gain, term = 0.0, 1.0
    for k in range(1, k_max + 1):
        term *= agree
        gain += term
        rate = (tokens + gain) / row_cost(rows + k)
        if rate > best_rate * 1.02:  # a margin: the estimates are noisy
            best, best_rate, best_gain = k, rate, gain
    return best, best_gain


class NgramCache:
    """n-grams of earlier requests and what followed them, shared by the
    sessions of one server (bounded, least recently used out). Consulted
    only when a session's own tokens have no match: a request that repeats
    an earlier one's answer (a template, a boilerplate reply) drafts it."""

    def __init__(self, *, n: int = 4, span: int = 16, max_entries: int = 200_000) -> None:
        if not isinstance(n, int) or not 1 <= n <= 16:
            raise ParameterError(f"NgramCache n must be in 1..16, got {n!r}")
        if not isinstance(span, int) or not 1 <= span <= 64:
            raise ParameterError(f"NgramCache span must be in 1..64, got {span!r}")
        if not isinstance(max_entries, int) or max_entries < 1:
            raise ParameterError(f"NgramCache max_entries must be >= 1, got {max_entries!r}")
        self.n, self.span, self.max_entries = n, span, max_entries
        self._map: OrderedDict[tuple[int, ...], tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0

    def add(self, tokens: Sequence[int]) -> None:
        """Records every n-gram of ``tokens`` with the tokens after it."""
        n, span = self.n, self.span
        toks = list(tokens)
        with self._lock:
            m = self._map
            for i in range(n, len(toks)):
                key = tuple(toks[i - n : i])
                m[key] = tuple(toks[i : i + span])
                m.move_to_end(key)
            while len(m) > self.max_entries:
                m.popitem(last=False)

    def lookup(self, tail: Sequence[int]) -> tuple[int, ...]:
        if len(tail) < self.n:
            return ()
        key = tuple(tail[-self.n :])
        with self._lock:
            got = self._map.get(key)
            if got is None:
                return ()
            self._map.move_to_end(key)
            self.hits += 1
            return got

    def __len__(self) -> int:
        return len(self._map)


class NgramDraft:
    """The n-gram draft of :class:`~oxillama.SpeculativeEngine` (and of
    ``AsyncEngine(speculative="ngram")``): proposes up to
    ``num_speculative`` tokens from the longest n-gram (``n_max`` down to
    ``n_min`` tokens) ending the context that occurred earlier in it
    (prompt and output), or in ``cache`` (earlier requests)."""

    method = "ngram"

    def __init__(
        self,
        *,
        n_max: int = 4,
        n_min: int = 1,
        num_speculative: int = 8,
        cache: NgramCache | None = None,
    ) -> None:
        for name, v in (("n_max", n_max), ("n_min", n_min)):
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 16:
                raise ParameterError(f"{name} must be an integer in 1..16, got {v!r}")
        if n_min > n_max:
            raise ParameterError(f"n_min ({n_min}) must not exceed n_max ({n_max})")
        if (
            not isinstance(num_speculative, int)
            or isinstance(num_speculative, bool)
            or not 1 <= num_speculative <= 32
        ):
            raise ParameterError(f"num_speculative must be in 1..32, got {num_speculative!r}")
        if cache is not None and not isinstance(cache, NgramCache):
            raise ParameterError(f"cache must be an NgramCache, got {type(cache).__name__}")
        self.n_max, self.n_min, self.num_speculative = n_max, n_min, num_speculative
        self.cache = cache

    def params(self) -> dict[str, int]:
        return {"n_max": self.n_max, "n_min": self.n_min, "num_speculative": self.num_speculative}

    def new_state(self, tokens: Iterable[int] = ()) -> NgramState:
        st = NgramState(self)
        st.extend(tokens)
        return st

    def __repr__(self) -> str:
        p = ", ".join(f"{k}={v}" for k, v in self.params().items())
        return f"NgramDraft({p})"


class NgramState:
    """One session's n-gram index and agreement estimates.

    The index maps each n-gram to the position right after its latest
    occurrence whose next token is known, updated as tokens are appended
    (never a rescan per step); a lookup is one dict probe per n."""

    def __init__(self, draft: NgramDraft) -> None:
        self.draft = draft
        self.tokens: list[int] = []
        self._maps: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(draft.n_min, draft.n_max + 1)
        }
        #: Agreement estimate per match length (-1: the shared cache), and
        #: over all lengths (what a length not seen yet starts from).
        self.agree: dict[int, float] = {}
        self.agree_all = _PRIOR
        #: Observations behind each estimate (see ``_weight``).
        self.count: dict[int, int] = {}
        self.count_all = 0
        self.drafted = 0
        self.accepted = 0

    # ------------------------------------------------------------- index

    def extend(self, tokens: Iterable[int]) -> None:
        toks, maps = self.tokens, self._maps
        for t in tokens:
            i = len(toks)
            for n, m in maps.items():
                if i >= n:
                    m[tuple(toks[i - n : i])] = i
            toks.append(int(t))

    def sync(self, tokens: Sequence[int]) -> None:
        """Catches up with a context that grew (appends the new tokens), or
        starts over when it changed otherwise. Checking the last known token
        is enough to tell: a wrong guess only costs drafts that fail."""
        have = len(self.tokens)
        if have <= len(tokens) and (have == 0 or self.tokens[-1] == tokens[have - 1]):
            self.extend(tokens[have:])
            return
        self.tokens = []
        for m in self._maps.values():
            m.clear()
        self.extend(tokens)

    def lookup(self, limit: int) -> tuple[int, list[int]]:
        """The longest match's length and up to ``limit`` tokens that
        followed it (``(0, [])`` when nothing matches)."""
        toks = self.tokens
        cache = self.draft.cache
        # The cache's matches are n-grams of its length: they rank with the
        # session's own matches of that length (own first).
        cache_at = cache.n if cache is not None else 0
        for n in range(max(self.draft.n_max, cache_at), 0, -1):
            if n <= self.draft.n_max and n >= self.draft.n_min and len(toks) >= n:
                pos = self._maps[n].get(tuple(toks[-n:]))
                if pos is not None:
                    return n, toks[pos : pos + limit]
            if n == cache_at and cache is not None:
                got = cache.lookup(toks)
                if got:
                    return -1, list(got[:limit])
        return 0, []

    # ---------------------------------------------------------- deciding

    def propose(
        self, room: int, tokens: float = 1.0, rows: int = 1
    ) -> tuple[int, list[int], list[int], float]:
        """``(n, proposal, drafts, gain)``: the match length, what it
        proposes, the prefix of it to verify now and the tokens that prefix
        is expected to add. ``room`` bounds the drafts (context left);
        ``tokens`` and ``rows`` describe the rest of the forward pass they
        join (see :func:`best_k`)."""
        limit = max(0, min(self.draft.num_speculative, room))
        if limit == 0:
            return 0, [], [], 0.0
        n, proposal = self.lookup(limit)
        if not proposal:
            return 0, [], [], 0.0
        k, gain = best_k(self.agree.get(n, self.agree_all), len(proposal), tokens, rows)
        return n, proposal, proposal[:k], gain

    def feedback(self, n: int, proposal: Sequence[int], k: int, new: Sequence[int]) -> None:
        """Updates the estimate for match length ``n`` from a round that
        verified ``k`` of ``proposal`` and produced ``new`` (the target's
        tokens). A round that drafted nothing still tells whether the
        proposal's first token was right."""
        if not proposal:
            return
        a = self.agree.get(n, self.agree_all)
        c = self.count.get(n, 0)
        seen = max(k, 1)
        for i in range(min(seen, len(new))):
            hit = float(new[i] == proposal[i])
            c += 1
            a += _weight(c) * (hit - a)
            self.count_all += 1
            self.agree_all += _weight(self.count_all) * (hit - self.agree_all)
            if not hit:
                break
        self.agree[n] = a
        self.count[n] = c
        if k:
            self.drafted += k
            self.accepted += min(len(new) - 1, k)

    # --------------------------------------------------------- snapshots

    def export(self) -> dict[str, Any]:
        return {
            "agree": {str(n): a for n, a in sorted(self.agree.items())},
            "agree_all": self.agree_all,
            "count": {str(n): c for n, c in sorted(self.count.items())},
            "count_all": self.count_all,
        }

    def load(self, data: Mapping[str, Any]) -> None:
        agree = data.get("agree", {})
        if not isinstance(agree, dict):
            raise ValueError("ngram.agree is not an object")
        out: dict[int, float] = {}
        for key, val in agree.items():
            n = int(key)
            if not (n == -1 or self.draft.n_min <= n <= self.draft.n_max):
                raise ValueError(f"ngram.agree has a match length {n} outside the draft's range")
            if not isinstance(val, float) or not 0.0 <= val <= 1.0:
                raise ValueError(f"ngram.agree[{n}] is not a probability")
            out[n] = val
        every = data.get("agree_all", _PRIOR)
        if not isinstance(every, float) or not 0.0 <= every <= 1.0:
            raise ValueError("ngram.agree_all is not a probability")
        counts = data.get("count")
        if counts is None:  # written before counts were kept
            counts = {key: _SETTLED for key in agree}
        if not isinstance(counts, dict) or set(counts) != set(agree):
            raise ValueError("ngram.count does not name the lengths of ngram.agree")
        count: dict[int, int] = {}
        for key, val in counts.items():
            if not isinstance(val, int) or isinstance(val, bool) or not 0 <= val <= _SETTLED:
                raise ValueError(f"ngram.count[{key}] is not a count")
            count[int(key)] = val
        count_all = data.get("count_all", _SETTLED if "count" not in data else None)
        if (
            not isinstance(count_all, int)
            or isinstance(count_all, bool)
            or not 0 <= count_all <= _SETTLED
        ):
            raise ValueError("ngram.count_all is not a count")
        self.agree = out
        self.agree_all = every
        self.count = count
        self.count_all = count_all
