"""`SessionState`: everything a conversation is, apart from the weights.

A synchronous :class:`~oxillama.Engine` holds one; an
:class:`~oxillama.AsyncSession` holds one inside the batching scheduler; a
snapshot is one written to bytes. Moving a session between them moves this
object, so what continues is exactly what stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

import oxillama._native as _native
from oxillama.decoding.grammar import Grammar
from oxillama.decoding.sampling import SamplerConfig, build_sampler
from oxillama.errors import GenerateError, OxiLlamaError, ParameterError
from oxillama.model.lora import LoraAdapter
from oxillama.model.lora import apply as apply_loras
from oxillama.model.model import Model

__all__ = ["ContextShift", "SessionState", "check_fits", "kept_prefix", "matcher_for"]

Live = tuple[Grammar, _native.GrammarMatcher]


def check_fits(n_prompt: int, n_past: int, n_ctx: int) -> None:
    """Raises when a prompt does not fit in what is left of a context."""
    free = n_ctx - n_past
    if n_prompt > free:
        raise GenerateError(
            f"prompt of {n_prompt} tokens does not fit in the context: "
            f"context size is {n_ctx} with {n_past} tokens already used ({free} free)"
        )


@dataclass(frozen=True)
class ContextShift:
    """llama.cpp's context shift (``--context-shift --keep N``): when the
    context is full, keep the first ``n_keep`` tokens, drop half of the
    rest and continue. As llama-cli does with ``add_bos``, a context that
    starts with the BOS token of a model that adds one keeps it on top of
    ``n_keep``."""

    n_keep: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.n_keep, bool) or not isinstance(self.n_keep, int) or self.n_keep < 0:
            raise ParameterError(f"n_keep must be a non-negative integer, got {self.n_keep!r}")

    @classmethod
    def of(cls, enabled: bool, n_keep: int, model: Model) -> ContextShift | None:
        """The policy an engine asks for (None: off, the default), refused
        by name for architectures that cannot drop tokens from a context."""
        if not isinstance(enabled, bool):
            raise ParameterError(f"context_shift must be a bool, got {enabled!r}")
        policy = cls(n_keep)  # n_keep is checked even when the shift is off
        if not enabled:
            return None
        cfg = model.config
        if cfg.get("recurrent"):
            raise ParameterError(
                f"context_shift is not supported by the recurrent {model.arch} architecture: "
                "its state holds every token it has seen and cannot drop some"
            )
        return policy

    def plan(self, tokens: list[int], n_past: int, bos: int | None) -> tuple[int, int]:
        """``(keep, discard)`` for a context of ``n_past`` tokens:
        llama.cpp's ``n_discard = (n_past - n_keep) / 2``. ``discard`` is 0
        when nothing can be dropped."""
        keep = self.n_keep + (1 if bos is not None and tokens[:1] == [bos] else 0)
        keep = min(keep, n_past)
        return keep, (n_past - keep) // 2

    def plan_for(self, tokens: list[int], n_past: int, tokenizer: Any) -> tuple[int, int]:
        """:meth:`plan` for a context made with ``tokenizer``, whose BOS
        is kept only when the model adds one."""
        return self.plan(tokens, n_past, tokenizer.bos_id if tokenizer.add_bos else None)


def matcher_for(
    live: Live | None, constraint: Grammar | None, tokenizer: Any, *, resume: bool
) -> tuple[Live | None, _native.GrammarMatcher | None]:
    """The grammar state a call runs with, and its matcher: the live one
    when the call continues (empty prompt) the same unfinished grammar, a
    fresh one for any other constrained call, none without a constraint."""
    if constraint is None:
        return None, None
    if resume and live is not None and live[0] == constraint and not live[1].is_terminated():
        return live, live[1]
    matcher = constraint.matcher(tokenizer)
    return (constraint, matcher), matcher


def cut_to_kept(kv: _native.Session, n: int) -> int:
    """Truncates ``kv`` to ``n`` positions, or, for a recurrent model that
    kept no state there, to the nearest earlier position it kept; returns
    the position reached (the caller evaluates the tokens after it)."""
    k = n
    while k > 0 and not kv.can_truncate(k):
        k -= 1
    kv.truncate(k)
    return k


def kept_prefix(held: list[int], wanted: list[int]) -> int:
    """How many leading tokens of a rendered chat (``wanted``) a context
    holding ``held`` keeps: their common prefix, leaving at least one token
    to evaluate, so a multi-turn chat evaluates only its new turn."""
    common = 0
    for a, b in zip(held, wanted, strict=False):
        if a != b:
            break
        common += 1
    return min(common, len(wanted) - 1)


def _seeded(config: SamplerConfig) -> SamplerConfig:
    if not isinstance(config, SamplerConfig):
        raise TypeError(f"sampler must be a SamplerConfig, not {type(config).__name__}")
    return config.seeded()


def _sampler(model: Model, config: SamplerConfig) -> _native.Sampler:
    return build_sampler(config, model.tokenizer, model.vocab_size)


@dataclass(eq=False)
class SessionState:
    """A session's KV cache and position (``kv``), its token history, its
    live sampler and grammar matcher, and the next-token logits.

    The logits may be held as the last position's hidden state instead
    (``hidden``): the output head turns it into bit-identical logits on
    first use, so a restore or a session waiting for its next turn does not
    spend the head's matrix product (or its 4 bytes per vocabulary entry) on
    logits that a new prompt will replace."""

    model: Model
    kv: _native.Session
    sampler_config: SamplerConfig
    sampler: _native.Sampler
    tokens: list[int] = field(default_factory=list)
    logits: npt.NDArray[np.float32] | None = None
    hidden: npt.NDArray[np.float32] | None = None
    grammar: tuple[Grammar, _native.GrammarMatcher] | None = None
    #: While hibernated: the KV of the first ``n`` positions, exported, and
    #: ``kv`` holds no pages (see :meth:`hibernate`).
    swapped: tuple[int, bytes] | None = None
    #: Active LoRA adapters and their scales, in order (``kv`` applies them).
    loras: dict[LoraAdapter, float] = field(default_factory=dict)
    #: The context shift the session runs with (None: a full context ends
    #: a generation with "length"), and how many shifts it has made.
    context_shift: ContextShift | None = None
    shifts: int = 0

    def set_loras(self, active: dict[LoraAdapter, float]) -> None:
        """Makes ``active`` the session's adapters (the KV already computed
        stays as it is, as in llama.cpp)."""
        if self.hidden is not None and self.swapped is None:
            # Pending logits come from the head under the old adapters.
            self.last_logits()
        apply_loras(self.kv, active)
        self.loras = dict(active)

    @classmethod
    def fresh(cls, model: Model, kv: _native.Session, config: SamplerConfig) -> SessionState:
        """An empty session on ``kv`` with a new live sampler for ``config``
        (an unseeded config gets its seed here, kept in ``sampler_config``)."""
        config = _seeded(config)
        return cls(model=model, kv=kv, sampler_config=config, sampler=_sampler(model, config))

    def fork(self) -> SessionState:
        """A state that continues exactly as this one would, its KV pages
        shared copy on write (``Session.fork``: recurrent state copied) and
        everything else copied: tokens, next-token logits, the live
        sampler's state, the grammar matcher's state, adapters, the context
        shift. A hibernated state's fork shares its exported KV bytes."""
        kv = self.kv.fork(0 if self.swapped is not None else self.kv.n_past)
        sampler = _sampler(self.model, self.sampler_config)
        sampler.set_state(self.sampler.get_state())
        grammar = None
        if self.grammar is not None:
            g, matcher = self.grammar
            twin = g.matcher(self.model.tokenizer)
            twin.import_state(matcher.export_state())
            grammar = (g, twin)
        return SessionState(
            model=self.model,
            kv=kv,
            sampler_config=self.sampler_config,
            sampler=sampler,
            tokens=list(self.tokens),
            logits=None if self.logits is None else self.logits.copy(),
            hidden=None if self.hidden is None else self.hidden.copy(),
            grammar=grammar,
            swapped=self.swapped,
            loras=dict(self.loras),
            context_shift=self.context_shift,
            shifts=self.shifts,
        )

    def set_sampler(self, config: SamplerConfig) -> None:
        """Replaces the live sampler with a fresh one built from ``config``."""
        config = _seeded(config)
        self.sampler = _sampler(self.model, config)
        self.sampler_config = config

    def truncate(self, n: int) -> None:
        """Keeps the first ``n`` positions (``n`` at most ``n_past``, not
        hibernated). The logits of position n-1 are gone, so the next step
        must evaluate, and a grammar cannot resume."""
        self.rewind_kv(n)
        del self.tokens[n:]
        self.set_logits(None)
        self.grammar = None

    def shift_for(self, n_new: int) -> bool:
        """Makes room for ``n_new`` more tokens by context shifts (as many
        as it takes), when the session has a shift policy and the tokens do
        not fit. Returns whether they fit now. The next-token logits stay:
        llama.cpp samples the logits computed before the shift, too."""
        policy = self.context_shift
        while self.n_past + n_new > self.n_ctx:
            if policy is None or self.swapped is not None:
                return False
            keep, discard = policy.plan_for(self.tokens, self.n_past, self.model.tokenizer)
            if discard < 1:
                return False
            try:
                self.kv.shift(keep, discard)
            except OxiLlamaError:
                return False  # no pages to copy shared ones into: a full context
            del self.tokens[keep : keep + discard]
            self.shifts += 1
        return True

    def rewind_kv(self, n: int) -> None:
        """Moves the session back to position ``n`` (``self.tokens`` still
        holds the tokens up to the old position). A recurrent model keeps its
        state only at some positions: it goes back to the nearest one at or
        before ``n`` and evaluates the tokens in between again, which gives
        the same state, since a forward pass is deterministic."""
        k = cut_to_kept(self.kv, n)
        if n > k:
            self.kv.eval(np.asarray(self.tokens[k:n], dtype=np.uint32), False)

    @property
    def n_past(self) -> int:
        return self.swapped[0] if self.swapped is not None else int(self.kv.n_past)

    @property
    def n_ctx(self) -> int:
        return int(self.kv.n_ctx)

    def hibernate(self) -> None:
        """Moves the KV out of its pages into bytes (exactly: the raw
        cache, not a recomputation) and gives the pages back."""
        if self.swapped is None:
            self.swapped = (int(self.kv.n_past), self.kv.export_kv())
            self.kv.truncate(0)
            self.kv.release_scratch()

    def wake(self) -> None:
        """Puts hibernated KV back into pages (which must be free)."""
        if self.swapped is not None:
            n, data = self.swapped
            self.kv.import_kv(n, data)
            self.swapped = None

    def kv_len(self) -> int:
        """Bytes of the exported KV cache."""
        return len(self.swapped[1]) if self.swapped is not None else int(self.kv.export_kv_len())

    def export_kv_into(self, out: memoryview) -> None:
        if self.swapped is not None:
            out[:] = self.swapped[1]
        else:
            self.kv.export_kv_into(out)

    def last_logits(self) -> npt.NDArray[np.float32] | None:
        """The next-token logits, computed from ``hidden`` when needed."""
        if self.logits is None and self.hidden is not None:
            self.logits = self.kv.head_logits(self.hidden)
            self.hidden = None
        return self.logits

    def set_logits(self, logits: npt.NDArray[np.float32] | None) -> None:
        self.logits = logits
        self.hidden = None

    def park(self) -> None:
        """Between turns: keeps the next-token logits as the hidden state
        when the head reproduces them bit for bit (by construction after a
        one-row eval), and lets the native session free its activations."""
        if self.logits is not None and self.kv.logits_from_head:
            h = self.kv.last_hidden()
            if h is not None:
                self.hidden, self.logits = h, None
        self.kv.release_scratch()
