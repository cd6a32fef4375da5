"""Speculative decoding: a small draft model proposes ``k`` tokens, the
target verifies them in one forward pass, and the output is distributed
exactly as the target's alone (token for token under greedy decoding).

Each round:

1. the draft proposes ``d_1..d_k`` from its own distributions ``q_i``;
2. the target evaluates the pending token and ``d_1..d_k`` at once, giving
   its distributions ``p_0..p_k`` (rows attended one by one with the
   one-token kernel, so they equal one-token evaluations bit for bit);
3. ``d_i`` is accepted when ``p(d_i) >= q(d_i)``, else with probability
   ``p(d_i) / q(d_i)``; at the first rejection a token is drawn from the
   residual ``max(0, p - q) / Z``; when all are accepted a bonus token is
   drawn from ``p_k`` (greedy: accept while the draft agrees with the
   target's argmax, then take the target's argmax);
4. both KV caches roll back to the accepted prefix by truncation; nothing
   is evaluated twice.

With ``async_draft=True`` the draft does not wait for the verdict: while the
target verifies round ``r``, a background thread assumes every draft is
accepted, guesses the bonus token (the draft's argmax there) and drafts
round ``r + 1``. When the verdict agrees (all accepted, bonus as guessed),
round ``r + 1`` starts verifying at once; on any divergence the look-ahead
is cancelled at its next step and its KV rolled back. The draft's random
draws are then keyed by (seed, round, slot) instead of taken from one
stream, so what a seeded run produces does not depend on thread timing,
nor on whether a look-ahead was used or thrown away. (Grammar-constrained
rounds draft synchronously: the matcher is one state.)

With an :class:`~oxillama.NgramDraft` the drafts come from the context
itself (see ``ngram_draft.py``) and cost nothing to make. A proposal is
deterministic (q is one-hot at the drafted token), so the rule above reduces
to: draw the target's token at each position as without speculation and
accept the draft when it is that token; at the first difference the drawn
token is the residual draw (``p`` with the draft's token removed). Each
emitted token takes exactly one uniform, so what a seeded run produces does
not depend on how many tokens were drafted.

Every stage of the sampler chain takes part. ``p_i`` and ``q_i`` are the
final distributions of the target's and the draft's chains (the native
``Sampler.probs``: penalties, DRY, typical-p, top-a, eta/epsilon cutoffs,
mirostat's cut at its current ``mu``; XTC's random removal weighed in as
the mixture of its two outcomes). Stages that read history see the drafts
accepted so far while later positions are verified: the target's sampler
state is saved at the start of a round, advanced over each accepted draft
and restored at the end. Only tokens that are emitted are then committed
to it (history, and mirostat's ``mu`` moved by the token's probability
under ``p``), so rejected drafts, tokens past a stop and held-back tokens
leave no trace. The draft's own chain (``draft_sampler=``, by default the
target's config) advances the same way; its ``mu`` moves only with drafts
it made and that were accepted (the round's last token, a residual or
bonus draw, enters its history alone), which a look-ahead can assume
exactly. As with :class:`Engine`, passing ``sampler=`` starts a fresh live
sampler (empty history, ``mu = 2 tau``) that the prompt then enters;
``sampler=None`` continues the live one.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import secrets
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from oxillama._native import GrammarMatcher
from oxillama.decoding.completion import (
    Completion,
    FinishReason,
    Speculation,
    SpeculativeCounts,
    Timings,
)
from oxillama.decoding.grammar import Grammar, allowed_bytes
from oxillama.decoding.grammar import constraint as _constraint
from oxillama.decoding.ngram_draft import NgramDraft, NgramState
from oxillama.decoding.sampling import SamplerConfig, build_sampler
from oxillama.engine.engine import CODEC_PACKAGE, Engine, Prompt
from oxillama.engine.session_state import cut_to_kept
from oxillama.errors import GenerateError, OxiLlamaError, ParameterError
from oxillama.text.assembler import TextAssembler

__all__ = ["SpeculativeEngine", "SpeculativeStats"]


@dataclass
class SpeculativeStats:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0

    #: Rounds that ended with a rejected draft.
    rejected: int = 0
    #: Rounds whose drafts came from a look-ahead (``async_draft``).
    ahead_used: int = 0
    #: Look-aheads thrown away because the verdict diverged.
    ahead_cancelled: int = 0
    #: Extra tokens drawn from the target after a fully accepted round.
    bonus: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


#: A round's new tokens, and per token its probability under the target's
#: chain and (for an accepted draft) under the draft's.
_Ps = tuple[float | None, float | None]
_Round = tuple[list[int], list[_Ps]]


@dataclass
class _LookAhead:
    """Drafts for the round after the one being verified."""

    #: Committed tokens the drafts assume (the current ones + all drafts + guess).
    base: int
    guess: int
    drafts: list[int]
    qs: list[npt.NDArray[np.float64]]
    #: ``q_i(d_i)`` as float32 values, what the draft's mirostat moves by.
    q_tok: list[float]


class SpecCodec(Protocol):
    """Reads and writes a :class:`SpeculativeEngine` as OXISPEC1. The
    sessions package (``oxillama.sessions.spec``) registers itself here when
    it is imported, as the OXISNAP1 codec does for :class:`Engine`, so the
    engine runs snapshots without importing the layer above it."""

    def dump(
        self, spec: SpeculativeEngine, path: str | os.PathLike[str], *, durable: bool = True
    ) -> None: ...
    def dumps(self, spec: SpeculativeEngine) -> bytes: ...
    def load(
        self,
        path: str | os.PathLike[str],
        *,
        target_model_path: str | os.PathLike[str] | None = None,
        draft_model_path: str | os.PathLike[str] | None = None,
    ) -> SpeculativeEngine: ...
    def loads(
        self,
        blob: bytes | bytearray | memoryview,
        *,
        target_model_path: str | os.PathLike[str] | None = None,
        draft_model_path: str | os.PathLike[str] | None = None,
    ) -> SpeculativeEngine: ...


_SPEC_CODEC: list[SpecCodec] = []


def register_spec_codec(codec: SpecCodec) -> None:
    _SPEC_CODEC[:] = [codec]


def _spec_codec() -> SpecCodec:
    if not _SPEC_CODEC:
        # Registered when the sessions package loads (as OXISNAP1's codec).
        importlib.import_module(CODEC_PACKAGE)
    return _SPEC_CODEC[0]


class SpeculativeEngine:
    """Speculative decoding with ``target`` verifying ``draft``'s guesses.

    The engines must share a vocabulary. ``seed`` seeds the accept/reject
    and residual draws (and the drafts' own draws); ``None`` draws one from
    the OS, kept as ``self.seed`` and reported as ``Completion.seed``.
    ``draft_sampler`` is the config the draft proposes with (default: the
    target's, whichever is live); any config keeps the output distributed
    as the target's, a closer one gets more drafts accepted. A full context
    ends a generation with "length": engines made with
    ``context_shift=True`` are refused (:class:`~oxillama.ParameterError`).
    """

    def __init__(
        self,
        target: Engine,
        draft: Engine | NgramDraft,
        *,
        num_speculative: int | None = None,
        seed: int | None = None,
        async_draft: bool = False,
        draft_sampler: SamplerConfig | None = None,
    ) -> None:
        if draft_sampler is not None and not isinstance(draft_sampler, SamplerConfig):
            raise ParameterError(
                f"draft_sampler must be a SamplerConfig or None, got {type(draft_sampler).__name__}"
            )
        if isinstance(draft, NgramDraft):
            if draft_sampler is not None:
                raise ParameterError("draft_sampler needs a draft model; an n-gram draft has none")
            # Its own num_speculative is the only one: two would be ambiguous.
            if num_speculative is not None:
                raise ParameterError(
                    "num_speculative is set on the NgramDraft, not on SpeculativeEngine"
                )
            if async_draft:
                raise ParameterError("async_draft needs a draft model; an n-gram draft is free")
            self._adopt(target, draft, draft.num_speculative, seed, False)
            self.reset()
            return
        if not isinstance(draft, Engine):
            raise ParameterError(
                f"draft must be an Engine or an NgramDraft, got {type(draft).__name__}"
            )
        if num_speculative is None:
            num_speculative = 4
        if not isinstance(num_speculative, int) or not 1 <= num_speculative <= 32:
            raise ParameterError(f"num_speculative must be in 1..32, got {num_speculative!r}")
        _check_vocab(target, draft)
        if async_draft and draft.config.get("recurrent"):
            # The look-ahead thread continues the draft's state past a
            # position it may have to give back; a recurrent state cannot
            # be cut there without evaluating again.
            raise ParameterError(
                "async_draft needs an attention draft model; "
                f"{draft.arch!r} is recurrent (use async_draft=False)"
            )
        if draft_sampler is not None:
            draft_sampler.validate(draft.vocab_size)
        self._adopt(target, draft, num_speculative, seed, async_draft, draft_sampler)
        self.reset()

    @classmethod
    def auto(
        cls,
        target_path: str | os.PathLike[str],
        candidates: Sequence[str | os.PathLike[str]],
        *,
        num_speculative: int = 4,
        seed: int | None = None,
        context_size: int | None = None,
        threads: int | None = None,
    ) -> SpeculativeEngine:
        """Picks the draft from ``candidates``: the smallest GGUF file that
        is smaller than the target and has the same vocabulary. Raises
        ParameterError, with each candidate's reason, when none fits."""
        target = Engine(target_path, context_size=context_size, threads=threads)
        size = os.path.getsize(target_path)
        reasons: list[str] = []
        best: tuple[int, Engine] | None = None
        for c in candidates:
            try:
                c_size = os.path.getsize(c)
            except OSError as e:
                reasons.append(f"{c}: {e.strerror}")
                continue
            if c_size >= size:
                reasons.append(f"{c}: not smaller than the target ({c_size} >= {size} bytes)")
                continue
            if best is not None and c_size >= best[0]:
                reasons.append(f"{c}: a smaller compatible draft was found")
                continue
            try:
                draft = Engine(c, context_size=target.n_ctx, threads=threads)
                _check_vocab(target, draft)
            except OxiLlamaError as e:
                reasons.append(f"{c}: {e}")
                continue
            best = (c_size, draft)
        if best is None:
            raise ParameterError(
                "no compatible draft model among the candidates:\n  " + "\n  ".join(reasons)
            )
        return cls(target, best[1], num_speculative=num_speculative, seed=seed)

    def _adopt(
        self,
        target: Engine,
        draft: Engine | NgramDraft,
        k: int,
        seed: int | None,
        async_draft: bool = False,
        draft_sampler: SamplerConfig | None = None,
    ) -> None:
        for role, eng in (("target", target), ("draft", draft)):
            if isinstance(eng, Engine) and eng.context_shift is not None:
                # The two caches, the pending token, held-back tokens and
                # look-aheads would all have to shift in step; a policy
                # the rounds never applied would end at the context size.
                raise ParameterError(
                    "context shift is not supported with speculative decoding: the "
                    f"{role} engine has context_shift=True (make it without one)"
                )
        self.target, self.draft = target, draft
        #: The draft's own config; None follows the target's live one.
        self.draft_sampler = draft_sampler
        self.num_speculative = k
        # Unseeded: drawn once, so reset() restarts the same stream and the
        # completions can report it.
        self.seed = seed if seed is not None else secrets.randbits(63)
        #: Draft the next round in a background thread while the target
        #: verifies (see the module docstring).
        self.async_draft = bool(async_draft)
        self._executor: ThreadPoolExecutor | None = None
        self._lookahead: _LookAhead | None = None
        # The engines' own sessions carry the KV, so each engine's OXISNAP1
        # snapshot (inside OXISPEC1) is its part of the state.
        self._t = target._session
        if isinstance(draft, NgramDraft):
            self._d: Any = None
            self._n_ctx = target.n_ctx
        else:
            self._d = draft._session
            self._n_ctx = min(target.n_ctx, draft.n_ctx)

    def reset(self) -> None:
        """Empties both contexts; the RNG restarts from the seed."""
        self.target.reset()
        if isinstance(self.draft, Engine):
            self.draft.reset()
        #: The n-gram draft's index and estimates for this session.
        self._ng: NgramState | None = (
            self.draft.new_state() if isinstance(self.draft, NgramDraft) else None
        )
        self._tokens: list[int] = []
        #: The n-gram path's logits after a prompt pass, until the first
        #: round draws from them.
        self._prompt_logits: npt.NDArray[np.float32] | None = None
        self._grammar: Grammar | None = None
        self._matcher: GrammarMatcher | None = None
        #: Tokens a round already decided but a max_tokens cut held back;
        #: the next continuation emits them first, so 20 + 40 tokens are
        #: the same as 60 at once (also across a snapshot).
        self._ahead: list[int] = []
        self._ahead_complete: int | None = None
        #: Tokens the running call may still emit (bounds n-gram drafts).
        self._left = 1 << 30
        self._complete_at: int | None = None
        if getattr(self, "_lookahead", None) is not None:
            self._lookahead = None
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        #: Key of the draft's keyed draws (async mode); saved in snapshots.
        self._draft_key = self.seed
        self._lookahead = None
        #: Per held-back token: its probability under the target's chain
        #: and, for an accepted draft, under the draft's (what each live
        #: sampler advances by once the token is emitted).
        self._ahead_ps: list[_Ps] = []
        # Like Engine.reset: the live config stays, its state starts over.
        self._set_sampler(getattr(self, "_cfg", None) or self.target.sampler)
        self.stats = SpeculativeStats()

    def _set_sampler(self, cfg: SamplerConfig) -> None:
        """Fresh live samplers for the target (``cfg``) and the draft: empty
        history, mirostat's ``mu`` at ``2 tau``. Their own RNGs are never
        used (draws come from ``self._rng`` and the keyed uniforms)."""
        tok = self.target.tokenizer
        self._cfg = cfg
        self._ts = build_sampler(cfg, tok, self.target.vocab_size)
        self._ds: Any = None
        if isinstance(self.draft, Engine):
            dcfg = self.draft_sampler if self.draft_sampler is not None else cfg
            self._ds = build_sampler(dcfg, tok, self.draft.vocab_size)

    @property
    def sampler(self) -> SamplerConfig:
        """The live target config (the last ``sampler=`` passed, else the
        target engine's)."""
        return self._cfg

    def _draft_cfg(self) -> SamplerConfig:
        return self.draft_sampler if self.draft_sampler is not None else self._cfg

    def _commit(self, tok: int, ps: tuple[float | None, float | None]) -> None:
        """Enters an emitted (or prompt) token into both live samplers."""
        self._ts.advance(tok, ps[0])
        if self._ds is not None:
            self._ds.advance(tok, ps[1])

    @property
    def tokens(self) -> list[int]:
        return list(self._tokens)

    # ------------------------------------------------------------ sampling

    @staticmethod
    def _probs(
        sampler: Any, logits: npt.NDArray[np.float32], allowed: bytes | None
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float64]]:
        """The chain's final distribution from ``sampler``'s state, as float32
        (the exact values its mirostat moves by) and float64 (the rule's
        arithmetic)."""
        p32 = sampler.probs(np.ascontiguousarray(logits, dtype=np.float32), allowed)
        return p32, p32.astype(np.float64)

    def _dist(self, logits: npt.NDArray[np.float32], cfg: SamplerConfig) -> npt.NDArray[np.float64]:
        """The distribution ``cfg`` gives ``logits`` from a fresh state."""
        fresh = build_sampler(cfg, self.target.tokenizer, self.target.vocab_size)
        return self._probs(fresh, logits, None)[1]

    def _draw(self, p: npt.NDArray[np.float64], u: float | None = None) -> int:
        """A draw from ``p``, with the uniform ``u`` or the engine's RNG."""
        cdf = np.cumsum(p)
        if u is None:
            u = self._rng.random()
        return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), p.size - 1))

    def _uniform(self, round_id: int, slot: int) -> float:
        """The draft's uniform for draft ``slot`` of round ``round_id``: a
        pure function of the key, so a look-ahead and a synchronous redraft
        of the same round see the same numbers."""
        counter = np.array([round_id, slot, 0, 0], dtype=np.uint64)
        raw = np.random.Philox(key=self._draft_key, counter=counter).random_raw()
        return float(int(raw) >> 11) * 2.0**-53

    # ----------------------------------------------------------- decoding

    def _allowed(self, size: int) -> npt.NDArray[np.bool_] | None:
        """The grammar's allowed tokens now, as a boolean vector."""
        m = self._matcher
        if m is None:
            return None
        bits = np.unpackbits(np.frombuffer(m.mask(), dtype=np.uint8), bitorder="little")
        out = np.zeros(size, dtype=bool)
        n = min(size, bits.size)
        out[:n] = bits[:n].astype(bool)
        return out

    def _mask(self) -> bytes | None:
        """The grammar's allowed tokens now, as the native sampler takes them."""
        m = self._matcher
        return None if m is None else allowed_bytes(m, self.target.vocab_size)

    def _propose(
        self, q_logits: npt.NDArray[np.float32], allowed: bytes | None, u: float | None
    ) -> tuple[int, npt.NDArray[np.float64], float]:
        """One draft token from the draft's chain in its current state (which
        then takes the token): the token, ``q`` and ``q(token)``."""
        q32, q = self._probs(self._ds, q_logits, allowed)
        tok = int(np.argmax(q32)) if self._draft_cfg().temperature == 0 else self._draw(q, u)
        qt = float(q32[tok])
        self._ds.advance(tok, qt)
        return tok, q, qt

    def _round(self, greedy: bool) -> _Round:
        """One draft-and-verify round; returns the new tokens (>= 1) and
        what each live sampler advances by when one is emitted."""
        if self._ng is not None:
            return self._ngram_round(self._ng, greedy)
        if self.async_draft and self._matcher is None:
            return self._round_async(greedy)
        k = self.num_speculative
        n0 = len(self._tokens) - 1  # positions evaluated by the target
        k = max(1, min(k, self._n_ctx - n0 - 1))
        if self._t.n_past < n0:  # tokens emitted from the held-back buffer
            behind = self._tokens[self._t.n_past : n0]
            self._t.eval(np.asarray(behind, dtype=np.uint32), False)
        catch_up = self._tokens[self._d.n_past :]
        q_logits = self._d.eval(np.asarray(catch_up, dtype=np.uint32), False)
        m = self._matcher
        drafts: list[int] = []
        qs: list[npt.NDArray[np.float64]] = []
        q_tok: list[float] = []
        # The grammar's mask at each drafted position; the target's rows at
        # the same positions see the same matcher states, so they reuse them.
        masks: list[bytes | None] = []
        saved = self._ds.get_state()
        try:
            for i in range(k):
                allowed = self._mask()
                masks.append(allowed)
                tok, q, qt = self._propose(q_logits, allowed, None)
                drafts.append(tok)
                qs.append(q)
                q_tok.append(qt)
                if m is not None:
                    if not m.accept_token(tok):
                        raise GenerateError(
                            f"internal error: drafted token {tok} the grammar refuses"
                        )
                    if m.is_terminated():
                        break
                if i + 1 < k and not self.target.tokenizer.is_eog(tok):
                    q_logits = self._d.eval(np.asarray([tok], dtype=np.uint32), False)
                elif i + 1 < k:
                    break
        finally:
            self._ds.set_state(saved)
        masks.append(self._mask())
        if m is not None:
            m.rollback(len(drafts))
        new, ps, accepted = self._verify(n0, drafts, qs, q_tok, masks, greedy)
        cut_to_kept(self._d, min(self._d.n_past, n0 + 1 + accepted))
        return new, ps

    def _ngram_round(self, ng: NgramState, greedy: bool) -> _Round:
        """A round with n-gram drafts (see the module docstring): the target
        evaluates the pending token and the drafts; at each row its token is
        drawn as without speculation, and the round goes on while that is
        the draft. Right after a prompt the pending token's logits are the
        prompt pass's (as :class:`Engine` has them), so its token is drawn
        from those first and becomes the pending token."""
        saved = self._ts.get_state()
        try:
            return self._ngram_rows(ng, greedy)
        finally:
            self._ts.set_state(saved)

    def _pick(
        self, row: npt.NDArray[np.float32], allowed: bytes | None, greedy: bool
    ) -> tuple[int, _Ps]:
        """The target's own token at ``row`` from its live chain, which then
        takes it (the next row's history includes it)."""
        if greedy:
            # At temperature 0 the chain's distribution is the point mass at
            # the argmax `sample` returns (it draws nothing, changes
            # nothing): no vocabulary-sized arrays per verified row.
            tok, pt = (
                int(self._ts.sample(np.ascontiguousarray(row, dtype=np.float32), allowed)),
                1.0,
            )
        else:
            p32, p = self._probs(self._ts, row, allowed)
            tok = self._draw(p)
            pt = float(p32[tok])
        self._ts.advance(tok, pt)
        return tok, (pt, None)

    def _ngram_rows(self, ng: NgramState, greedy: bool) -> _Round:
        m = self._matcher
        vocab = self.target.vocab_size
        first: list[int] = []
        ps: list[_Ps] = []
        masks: list[bytes | None] = []
        prompt_logits, self._prompt_logits = self._prompt_logits, None
        if prompt_logits is not None:
            tok0, pr = self._pick(prompt_logits, self._mask(), greedy)
            first, ps = [tok0], [pr]
            ends = self.target.tokenizer.is_eog(tok0)
            if m is not None:
                if not m.accept_token(tok0):
                    raise GenerateError(f"internal error: token {tok0} the grammar refuses")
                ends = ends or m.is_terminated()
                m.rollback(1)
            if ends:
                self._commit_round(first, 0, 0)
                return first, ps
            n0 = len(self._tokens)
        else:
            n0 = len(self._tokens) - 1
            if self._t.n_past < n0:  # tokens emitted from the held-back buffer
                behind = self._tokens[self._t.n_past : n0]
                # As the one-token steps that would have evaluated them.
                self._t.exact_rows = True
                try:
                    self._t.eval(np.asarray(behind, dtype=np.uint32), False)
                finally:
                    self._t.exact_rows = False
        ng.sync(self._tokens + first if first else self._tokens)
        # Drafts past the call's max_tokens would be verified, held back,
        # dropped from the cache at the end of the call (it holds only
        # committed tokens) and evaluated again by the next call: cut them.
        # The tokens do not depend on the cut (each row's token is drawn as
        # without speculation).
        room = min(self._n_ctx - n0 - 1, self._left - len(first) - 1)
        n, proposal, drafts, _ = ng.propose(max(room, 0))
        if m is not None:
            # Only drafts the grammar allows are verified; the target's rows
            # at those positions see the same matcher states.
            for tok in first:
                m.accept_token(tok)
            kept: list[int] = []
            for tok in drafts:
                allowed = self._allowed(vocab)
                if allowed is None or not allowed[tok] or m.is_terminated():
                    break
                masks.append(self._mask())
                if not m.accept_token(tok):
                    break
                kept.append(tok)
            masks.append(self._mask())
            m.rollback(len(kept) + len(first))
            drafts = kept
        else:
            masks = [None] * (len(drafts) + 1)
        pending = first[0] if first else self._tokens[-1]
        batch = np.asarray([pending, *drafts], dtype=np.uint32)
        # Verification rows must equal one-token evaluations exactly.
        self._t.exact_rows = True
        try:
            p_rows = self._t.eval(batch, True)
        finally:
            self._t.exact_rows = False
        new: list[int] = []
        for i in range(len(drafts) + 1):
            tok, pr = self._pick(p_rows[i], masks[i], greedy)
            new.append(tok)
            ps.append(pr)
            if i == len(drafts) or tok != drafts[i]:
                break
        accepted = len(new) - 1
        ng.feedback(n, proposal, len(drafts), new)
        self._commit_round(first + new, len(drafts), accepted)
        cut_to_kept(self._t, n0 + 1 + accepted)
        return first + new, ps

    def _commit_round(self, new: list[int], k: int, accepted: int) -> None:
        """Advances the grammar over a round's tokens and counts the round."""
        m = self._matcher
        self._complete_at = None
        if m is not None:
            for j, tok in enumerate(new):
                if not m.accept_token(tok):
                    raise GenerateError(f"internal error: token {tok} the grammar refuses")
                if self._complete_at is None and m.is_terminated():
                    # Like Engine: a complete grammar ends the text before
                    # anything (an EOS) is sampled after it.
                    self._complete_at = j
        self.stats.rounds += 1
        self.stats.drafted += k
        self.stats.accepted += accepted
        if accepted < k:
            self.stats.rejected += 1
        elif k > 0:
            self.stats.bonus += 1

    # ------------------------------------------------------ async drafting

    def _round_async(self, greedy: bool) -> _Round:
        """A round whose drafts may come from the previous round's look-ahead,
        and which starts the next look-ahead before verifying."""
        k = self.num_speculative
        n0 = len(self._tokens) - 1
        k = max(1, min(k, self._n_ctx - n0 - 1))
        rid = self.stats.rounds
        if self._t.n_past < n0:
            behind = self._tokens[self._t.n_past : n0]
            self._t.eval(np.asarray(behind, dtype=np.uint32), False)
        la, self._lookahead = self._lookahead, None
        if la is not None and la.base == len(self._tokens) and la.drafts:
            drafts, qs, q_tok = la.drafts[:k], la.qs[:k], la.q_tok[:k]
            # The draft evaluated all but the last look-ahead draft.
            cut_to_kept(self._d, min(self._d.n_past, n0 + len(drafts)))
            self.stats.ahead_used += 1
        else:
            if la is not None:
                # Not reachable through the public API (a look-ahead is
                # dropped whenever the tokens change otherwise); if it is,
                # the draft's cache is rebuilt rather than trusted.
                cut_to_kept(self._d, 0)
            drafts, qs, q_tok = self._draft_now(k, rid)
        cancel = threading.Event()
        job = self._pool().submit(self._look_ahead, n0, drafts, q_tok, k, rid + 1, cancel)
        try:
            new, ps, accepted = self._verify(
                n0, drafts, qs, q_tok, [None] * (len(drafts) + 1), greedy
            )
        except BaseException:
            cancel.set()
            job.result()
            raise
        if accepted < len(drafts) or len(new) != len(drafts) + 1:
            cancel.set()
        ahead = job.result()
        if ahead is not None and not cancel.is_set() and ahead.guess == new[-1]:
            self._lookahead = ahead
        else:
            if ahead is not None or cancel.is_set():
                self.stats.ahead_cancelled += 1
            cut_to_kept(self._d, min(self._d.n_past, n0 + 1 + accepted))
        return new, ps

    def _draft_now(
        self, k: int, rid: int
    ) -> tuple[list[int], list[npt.NDArray[np.float64]], list[float]]:
        """Drafts round ``rid`` synchronously, with keyed draws."""
        catch_up = self._tokens[self._d.n_past :]
        q_logits = self._d.eval(np.asarray(catch_up, dtype=np.uint32), False)
        saved = self._ds.get_state()
        try:
            return self._draft_from(q_logits, k, rid, None)
        finally:
            self._ds.set_state(saved)

    def _draft_from(
        self,
        q_logits: npt.NDArray[np.float32],
        k: int,
        rid: int,
        cancel: threading.Event | None,
    ) -> tuple[list[int], list[npt.NDArray[np.float64]], list[float]]:
        drafts: list[int] = []
        qs: list[npt.NDArray[np.float64]] = []
        q_tok: list[float] = []
        for i in range(k):
            tok, q, qt = self._propose(q_logits, None, self._uniform(rid, i))
            drafts.append(tok)
            qs.append(q)
            q_tok.append(qt)
            if i + 1 == k or self.target.tokenizer.is_eog(tok):
                break
            if cancel is not None and cancel.is_set():
                break
            q_logits = self._d.eval(np.asarray([tok], dtype=np.uint32), False)
        return drafts, qs, q_tok

    def _look_ahead(
        self,
        n0: int,
        drafts: list[int],
        q_tok: list[float],
        k: int,
        rid: int,
        cancel: threading.Event,
    ) -> _LookAhead | None:
        """Runs in the draft thread while the target verifies ``drafts``:
        assumes all are accepted, guesses the bonus token (the mode of the
        draft's chain), drafts round ``rid``. Stops early once ``cancel`` is
        set (a divergence). The draft's chain advances as the round's
        commit would if the guess is right (accepted drafts with their
        ``q``, the bonus token into the history alone), and is restored
        before returning."""
        if len(drafts) < k or self.target.tokenizer.is_eog(drafts[-1]):
            return None  # the round ends early: nothing to assume
        if n0 + 1 + len(drafts) + 1 + k >= self._n_ctx:
            return None
        saved = self._ds.get_state()
        try:
            for tok, qt in zip(drafts, q_tok, strict=True):
                self._ds.advance(tok, qt)
            q = self._d.eval(np.asarray([drafts[-1]], dtype=np.uint32), False)
            guess = int(np.argmax(self._probs(self._ds, q, None)[0]))
            if cancel.is_set() or self.target.tokenizer.is_eog(guess):
                return None
            self._ds.advance(guess, None)
            q = self._d.eval(np.asarray([guess], dtype=np.uint32), False)
            nxt, qs, nxt_q = self._draft_from(q, k, rid, cancel)
            if cancel.is_set():
                return None
            return _LookAhead(n0 + 1 + len(drafts) + 1, guess, nxt, qs, nxt_q)
        finally:
            self._ds.set_state(saved)

    def close(self) -> None:
        """Ends the background drafting thread of ``async_draft`` now rather
        than when the engine is collected. Nothing is lost: no draft runs
        between calls, a kept look-ahead stays valid, and the next round
        starts a new thread if it needs one."""
        ex, self._executor = self._executor, None
        if ex is not None:
            ex.shutdown(wait=True)

    def __enter__(self) -> SpeculativeEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="oxillama-draft")
        return self._executor

    def _drop_lookahead(self) -> None:
        """Forgets the look-ahead and its KV (snapshots, context changes):
        its drafts are a pure function of the state, so redrafting them
        later gives the same ones."""
        if self._lookahead is not None and self._d is not None:
            self._lookahead = None
            cut_to_kept(self._d, min(self._d.n_past, max(len(self._tokens) - 1, 0)))

    def _verify(
        self,
        n0: int,
        drafts: list[int],
        qs: list[npt.NDArray[np.float64]],
        q_tok: list[float],
        masks: list[bytes | None],
        greedy: bool,
    ) -> tuple[list[int], list[_Ps], int]:
        """Runs the target over the pending token and ``drafts``, applies
        the accept/reject rule and rolls the target back to what was
        accepted; returns the round's new tokens, their probabilities (the
        target's, and the draft's for an accepted draft) and how many
        drafts were accepted. The target's chain sees each accepted draft
        as history for the positions after it, and is restored after."""
        k = len(drafts)
        batch = np.asarray([self._tokens[-1], *drafts], dtype=np.uint32)
        # Verification rows must equal one-token evaluations exactly.
        self._t.exact_rows = True
        try:
            p_rows = self._t.eval(batch, True)
        finally:
            self._t.exact_rows = False
        new: list[int] = []
        ps: list[_Ps] = []
        saved = self._ts.get_state()
        try:
            for i, tok in enumerate(drafts):
                p32, p = self._probs(self._ts, p_rows[i], masks[i])
                q = qs[i]
                if greedy:
                    best = int(np.argmax(p32))
                    ok = best == tok
                else:
                    ok = bool(p[tok] >= q[tok] or self._rng.random() < p[tok] / q[tok])
                if ok:
                    new.append(tok)
                    ps.append((float(p32[tok]), q_tok[i]))
                    self._ts.advance(tok, float(p32[tok]))
                    continue
                if greedy:
                    t = best
                else:
                    residual = np.maximum(p - q, 0.0)
                    z = residual.sum()
                    t = self._draw(residual / z) if z > 0 else self._draw(p)
                new.append(t)
                ps.append((float(p32[t]), None))
                break
            else:
                p32, p = self._probs(self._ts, p_rows[k], masks[k])
                t = int(np.argmax(p32)) if greedy else self._draw(p)
                new.append(t)
                ps.append((float(p32[t]), None))
        finally:
            self._ts.set_state(saved)
        accepted = len(new) - 1
        self._commit_round(new, k, accepted)
        # Roll back to the accepted prefix: pending + accepted drafts.
        cut_to_kept(self._t, n0 + 1 + accepted)
        return new, ps, accepted

    def _run(
        self,
        prompt: Prompt,
        max_tokens: int,
        sampler: SamplerConfig | None,
        stop: Sequence[str],
        ignore_eos: bool,
        result: list[Completion],
        constraint: Grammar | None = None,
    ) -> Iterator[str]:
        if not isinstance(max_tokens, int) or max_tokens < 0:
            raise ParameterError(f"max_tokens must be a non-negative integer, got {max_tokens!r}")
        if sampler is not None:
            if not isinstance(sampler, SamplerConfig):
                raise ParameterError(
                    f"sampler must be a SamplerConfig or None, got {type(sampler).__name__}"
                )
            self._set_sampler(sampler)
        greedy = self._cfg.temperature == 0
        before = dataclasses.replace(self.stats)
        if isinstance(stop, str):
            stop = [stop]
        toks = (
            self.target.tokenize(prompt, add_special=not self._tokens)
            if isinstance(prompt, str)
            else self.target._check_tokens(prompt)
        )
        if not toks and not self._tokens:
            raise GenerateError("empty prompt and empty context: nothing to continue from")
        if len(self._tokens) + len(toks) >= self._n_ctx:
            raise GenerateError(
                f"prompt of {len(toks)} tokens does not fit in the context of {self._n_ctx} "
                f"({len(self._tokens)} used)"
            )
        t0 = time.perf_counter()
        if toks:
            # The context changed: held-back tokens no longer follow.
            self._ahead, self._ahead_ps = [], []
            self._drop_lookahead()
            if self._ng is not None:
                # The whole prompt in one pass, as Engine evaluates it, so
                # the first token is drawn from the same logits.
                head = self._tokens[self._t.n_past :] + toks
                self._prompt_logits = self._t.eval(np.asarray(head, dtype=np.uint32), False)
            else:
                # Everything but the last token is evaluated now; the last
                # one is "pending" and goes into the first verification batch.
                head = self._tokens[self._t.n_past :] + toks[:-1]
                if head:
                    self._t.eval(np.asarray(head, dtype=np.uint32), False)
            self._tokens += toks
            for t in toks:
                self._commit(t, (None, None))
        t1 = time.perf_counter()
        # The matcher continues when the same grammar continues an empty
        # prompt; otherwise a constrained text starts here.
        live = self._grammar
        if constraint is None:
            self._grammar, self._matcher = None, None
        elif not (not toks and live is not None and live == constraint and self._matcher):
            self._grammar, self._matcher = constraint, constraint.matcher(self.target.tokenizer)
        out = TextAssembler(stop)
        generated: list[int] = []
        finish: FinishReason = "length"
        done = False
        while not done and len(generated) < max_tokens:
            if len(self._tokens) >= self._n_ctx:
                break
            if self._matcher is not None and self._matcher.is_terminated() and not self._ahead:
                finish = "stop"  # the grammar is complete
                break
            if self._ahead:
                batch, ps, complete_at = self._ahead, self._ahead_ps, self._ahead_complete
            else:
                self._left = max_tokens - len(generated)
                batch, ps = self._round(greedy)
                complete_at = self._complete_at
            self._ahead, self._ahead_ps, self._ahead_complete = [], [], None
            for j, tok in enumerate(batch):
                eos_ends = not ignore_eos or self._matcher is not None
                # Like Engine, the live sampler takes every token it
                # produced, an ending EOS included.
                self._commit(tok, ps[j])
                if eos_ends and self.target.tokenizer.is_eog(tok):
                    finish, done = "eos", True
                    # The EOS is not part of the text; keep the context
                    # consistent with what was generated.
                    self._trim_to(len(self._tokens))
                    break
                self._tokens.append(tok)
                generated.append(tok)
                piece = out.push(self.target.tokenizer.token_to_piece(tok))
                if piece:
                    yield piece
                if out.stopped:
                    finish, done = "stop", True
                    break
                if complete_at == j:
                    finish, done = "stop", True
                    break
                if len(generated) >= max_tokens:
                    done = True
                    self._ahead, self._ahead_ps = batch[j + 1 :], ps[j + 1 :]
                    if complete_at is not None:
                        self._ahead_complete = complete_at - j - 1
                    break
            # Tokens past a stop are dropped; caches never hold more than
            # the committed tokens minus the pending one.
            self._trim_to(len(self._tokens))
        if self._prompt_logits is not None:
            # No round ran (max_tokens=0): the last prompt token is pending
            # again, as the caches' invariant wants.
            self._prompt_logits = None
            self._trim_to(len(self._tokens))
        tail = out.finish()
        if tail:
            yield tail
        if isinstance(self.draft, NgramDraft) and self.draft.cache is not None:
            self.draft.cache.add(self._tokens)
        t2 = time.perf_counter()
        result.append(
            Completion(
                text=out.text,
                tokens=generated,
                finish_reason=finish,
                timings=Timings(len(toks), t1 - t0, len(generated), t2 - t1),
                seed=self.seed,
                speculation=Speculation(
                    request=_counts(self.stats, before), total=_counts(self.stats)
                ),
            )
        )

    def _trim_to(self, n_tokens: int) -> None:
        keep = max(n_tokens - 1, 0)
        if self._t.n_past > keep:
            cut_to_kept(self._t, keep)
        la = self._lookahead
        if la is not None and la.base != n_tokens:
            self._lookahead = None
        if self._d is not None and self._d.n_past > keep and self._lookahead is None:
            cut_to_kept(self._d, keep)
        self._sync()

    def _sync(self) -> None:
        """Keeps each engine's token list equal to what its cache holds (the
        pending token is in neither), so its own snapshot is consistent."""
        pairs = [(self.target, self._t)]
        if isinstance(self.draft, Engine):
            pairs.append((self.draft, self._d))
        for eng, sess in pairs:
            # A draft look-ahead runs past the committed tokens; its engine
            # then only claims those (snapshots drop the look-ahead first).
            eng._tokens = self._tokens[: sess.n_past]
            eng._last_logits = None
            eng._grammar = None

    # ------------------------------------------------------------ snapshots

    def snapshot(self, path: str | os.PathLike[str], *, durable: bool = True) -> None:
        """Writes an OXISPEC1 file atomically (temp file, fsync, rename)."""
        _spec_codec().dump(self, path, durable=durable)

    def snapshot_bytes(self) -> bytes:
        return _spec_codec().dumps(self)

    @classmethod
    def restore(
        cls,
        path: str | os.PathLike[str],
        *,
        target_model_path: str | os.PathLike[str] | None = None,
        draft_model_path: str | os.PathLike[str] | None = None,
    ) -> SpeculativeEngine:
        """Continues a speculative session exactly (same tokens, same draws)."""
        return _spec_codec().load(
            path, target_model_path=target_model_path, draft_model_path=draft_model_path
        )

    @classmethod
    def restore_bytes(
        cls,
        blob: bytes | bytearray | memoryview,
        *,
        target_model_path: str | os.PathLike[str] | None = None,
        draft_model_path: str | os.PathLike[str] | None = None,
    ) -> SpeculativeEngine:
        return _spec_codec().loads(
            blob, target_model_path=target_model_path, draft_model_path=draft_model_path
        )

    def generate(
        self,
        prompt: Prompt = "",
        max_tokens: int = 256,
        *,
        sampler: SamplerConfig | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | Any | None = None,
    ) -> Completion:
        """Like :meth:`Engine.generate`: the session continues across calls,
        and ``grammar`` / ``json_schema`` constrain drafts and verification
        alike (the matcher rolls back with the KV caches)."""
        constraint = _constraint(grammar, json_schema)
        result: list[Completion] = []
        for _ in self._run(prompt, max_tokens, sampler, stop, ignore_eos, result, constraint):
            pass
        return result[0]

    def stream(
        self,
        prompt: Prompt = "",
        max_tokens: int = 256,
        *,
        sampler: SamplerConfig | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | Any | None = None,
    ) -> Iterator[str]:
        """Like :meth:`Engine.stream`."""
        constraint = _constraint(grammar, json_schema)
        result: list[Completion] = []
        yield from self._run(prompt, max_tokens, sampler, stop, ignore_eos, result, constraint)


def _counts(stats: SpeculativeStats, before: SpeculativeStats | None = None) -> SpeculativeCounts:
    """``stats`` as counts, less ``before`` when given."""
    b = before if before is not None else SpeculativeStats()
    return SpeculativeCounts(
        rounds=stats.rounds - b.rounds,
        drafted=stats.drafted - b.drafted,
        accepted=stats.accepted - b.accepted,
        rejected=stats.rejected - b.rejected,
        bonus=stats.bonus - b.bonus,
    )


def _check_vocab(target: Engine, draft: Engine) -> None:
    tt, dt = target.tokenizer, draft.tokenizer
    if target.vocab_size != draft.vocab_size or tt.vocab_size != dt.vocab_size:
        raise ParameterError(
            "draft and target vocabularies differ: "
            f"{draft.vocab_size} vs {target.vocab_size} tokens"
        )
    for i in range(tt.vocab_size):
        if tt.token_to_piece(i) != dt.token_to_piece(i):
            raise ParameterError(
                f"draft and target vocabularies differ at token {i}: "
                f"{dt.token_to_piece(i)!r} vs {tt.token_to_piece(i)!r}"
            )
