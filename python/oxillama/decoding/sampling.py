"""Sampler configuration. The chain itself runs in Rust (``_native.Sampler``)."""

from __future__ import annotations

import math
import numbers
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import oxillama._native as _native
from oxillama.errors import ParameterError

if TYPE_CHECKING:
    from oxillama.text.tokenizer import Tokenizer

__all__ = ["SamplerConfig"]

_INT_FIELDS = (
    "top_k",
    "repetition_penalty_window",
    "mirostat",
    "dry_allowed_length",
    "dry_penalty_last_n",
)
_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "mirostat_tau",
    "mirostat_eta",
    "dry_multiplier",
    "dry_base",
    "xtc_threshold",
    "xtc_probability",
    "typical_p",
    "top_a",
    "eta_cutoff",
    "epsilon_cutoff",
)
_UNIT_FIELDS = (
    "min_p",
    "xtc_threshold",
    "xtc_probability",
    "top_a",
    "eta_cutoff",
    "epsilon_cutoff",
)


def _bad(name: str, rule: str, value: object) -> ParameterError:
    return ParameterError(f"{name} must be {rule}, got {value!r}")


def _int(name: str, v: object, what: str = "an integer") -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise _bad(name, what, v)
    return int(v)


def _float(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise _bad(name, "a number", v)
    f = float(v)
    if math.isnan(f):
        raise _bad(name, "a number", v)
    return f


def _bias(items: Iterable[tuple[Any, Any]]) -> dict[int, float]:
    out: dict[int, float] = {}
    for k, v in items:
        if isinstance(k, str) and k.strip().lstrip("-").isdigit():
            k = int(k)  # JSON object keys are strings
        out[_int("logit_bias", k, "keyed by token ids")] = _float("logit_bias", v)
    return out


@dataclass(frozen=True)
class SamplerConfig:
    """Every stage of the sampler chain, with llama.cpp-like defaults.

    Stages run in this order: logit bias and banned tokens; the repetition
    penalty over the last ``repetition_penalty_window`` accepted tokens;
    OpenAI's ``frequency_penalty`` (times each token's count in that window)
    and ``presence_penalty`` (once per token seen there), subtracted from
    the logits; DRY;
    then the argmax when ``temperature == 0``; otherwise top-k, typical-p,
    top-p, min-p, top-a, epsilon and eta cutoffs, XTC, temperature and a
    draw from the seeded RNG. ``mirostat=2`` replaces everything after DRY
    with temperature and Mirostat v2. A stage at its neutral value is off:
    ``top_k=0``, ``top_p=1``, ``min_p=0``, ``repetition_penalty=1``,
    ``frequency_penalty=0``, ``presence_penalty=0``,
    ``dry_multiplier=0``, ``xtc_probability=0``, ``typical_p=1``,
    ``top_a=0``, ``eta_cutoff=0``, ``epsilon_cutoff=0``.

    ``seed=None`` (the default) draws a fresh 64-bit seed from the operating
    system for each live sampler made from the config: once for an engine's
    own sampler (later calls continue its stream), per call for a
    ``sampler=`` argument, per request in the server. The seed used is
    reported as ``Completion.seed``, so any run can be repeated.

    XTC keeps llama.cpp's defaults (``xtc_threshold=0.1``,
    ``xtc_probability=0``: off). The runtime we model resets XTC to
    threshold 0 and probability 0.5 on restore; under llama.cpp's definition
    that would remove every token but the least likely one half the time,
    so we do not follow it.

    ``dry_penalty_last_n=-1`` lets DRY see the whole (bounded) history, ``0``
    turns it off. ``dry_sequence_breakers`` are strings; the engine turns
    them into token ids with :meth:`dry_breaker_ids`. Checks that need the
    vocabulary size are in :meth:`validate`.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repetition_penalty: float = 1.0
    repetition_penalty_window: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    banned_tokens: Sequence[int] = ()
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: Sequence[str] = ("\n", ":", '"', "*")
    xtc_threshold: float = 0.1
    xtc_probability: float = 0.0
    typical_p: float = 1.0
    top_a: float = 0.0
    eta_cutoff: float = 0.0
    epsilon_cutoff: float = 0.0

    def __post_init__(self) -> None:
        # Normalize values (numpy scalars, ints for floats, containers) so
        # equal configs compare equal, to_dict() is plain JSON-able data and
        # the frozen dataclass stays immutable in practice.
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        for name in _INT_FIELDS:
            put(name, _int(name, getattr(self, name)))
        if self.seed is not None:
            put("seed", _int("seed", self.seed))
        for name in _FLOAT_FIELDS:
            put(name, _float(name, getattr(self, name)))
        lb = self.logit_bias
        if not isinstance(lb, Mapping):
            raise _bad("logit_bias", "a mapping of token id to bias", lb)
        put("logit_bias", _bias(lb.items()))
        if isinstance(self.banned_tokens, (str, bytes)) or not isinstance(
            self.banned_tokens, Iterable
        ):
            raise _bad("banned_tokens", "a sequence of token ids", self.banned_tokens)
        put(
            "banned_tokens",
            tuple(_int("banned_tokens", t, "token ids") for t in self.banned_tokens),
        )
        br = self.dry_sequence_breakers
        if isinstance(br, (str, bytes)) or not isinstance(br, Iterable):
            raise _bad("dry_sequence_breakers", "a sequence of strings", br)
        put("dry_sequence_breakers", tuple(br))
        for s in self.dry_sequence_breakers:
            if not isinstance(s, str) or not s:
                raise _bad("dry_sequence_breakers", "non-empty strings", s)

        checks: list[tuple[str, bool, str]] = [
            ("temperature", 0 <= self.temperature < math.inf, ">= 0"),
            ("top_k", self.top_k >= 0, ">= 0 (0 disables it)"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("typical_p", 0 < self.typical_p <= 1, "in (0, 1]"),
            ("repetition_penalty", 0 < self.repetition_penalty < math.inf, "> 0"),
            ("repetition_penalty_window", self.repetition_penalty_window >= 0, ">= 0"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "in [-2, 2]"),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "in [-2, 2]"),
            ("seed", self.seed is None or 0 <= self.seed < 2**64, "None or in [0, 2**64)"),
            ("mirostat", self.mirostat in (0, 2), "0 or 2"),
            ("mirostat_tau", 0 < self.mirostat_tau < math.inf, "> 0"),
            ("mirostat_eta", 0 < self.mirostat_eta <= 1, "in (0, 1]"),
            ("dry_multiplier", 0 <= self.dry_multiplier < math.inf, ">= 0"),
            ("dry_base", 1 <= self.dry_base < math.inf, ">= 1"),
            ("dry_allowed_length", self.dry_allowed_length >= 1, ">= 1"),
            (
                "dry_penalty_last_n",
                self.dry_penalty_last_n >= -1,
                ">= -1 (-1 means the whole history)",
            ),
            *((n, 0 <= getattr(self, n) <= 1, "in [0, 1]") for n in _UNIT_FIELDS),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise _bad(name, rule, getattr(self, name))
        for k in self.logit_bias:
            if k < 0:
                raise _bad("logit_bias", "keyed by non-negative token ids", k)
        for t in self.banned_tokens:
            if t < 0:
                raise _bad("banned_tokens", "non-negative token ids", t)

    def seeded(self) -> SamplerConfig:
        """This config with a concrete seed: its own, or 64 bits drawn from
        the operating system's entropy when ``seed`` is ``None``.

        Every live sampler is built from a seeded config, and the drawn seed
        is kept beside it (``Completion.seed``), so an unseeded run can be
        repeated exactly."""
        if self.seed is not None:
            return self
        return replace(self, seed=secrets.randbits(64))

    @classmethod
    def greedy(cls) -> SamplerConfig:
        """Temperature 0: always the most likely token (after bias, bans and penalties)."""
        return cls(temperature=0.0)

    def validate(self, vocab_size: int) -> None:
        """Checks the token ids against a vocabulary of ``vocab_size`` tokens."""
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 0:
            raise _bad("vocab_size", "a positive integer", vocab_size)
        for k in self.logit_bias:
            if k >= vocab_size:
                raise _bad("logit_bias", f"keyed by token ids < {vocab_size}", k)
        for t in self.banned_tokens:
            if t >= vocab_size:
                raise _bad("banned_tokens", f"token ids < {vocab_size}", t)

    def dry_breaker_ids(
        self,
        encode: Callable[[str], Sequence[int]],
        pieces: Sequence[str] | None = None,
    ) -> list[list[int]]:
        """The DRY sequence breakers as token-id sequences for ``_native.Sampler``.

        ``encode`` tokenizes one string (without special tokens). Given
        ``pieces`` (each token's decoded text, indexed by id), every token
        whose text contains a breaker is a breaker on its own too, so that,
        e.g., ``".\\n"`` breaks like ``"\\n"`` does, as in llama.cpp.
        """
        out: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()

        def add(seq: Sequence[int]) -> None:
            key = tuple(int(t) for t in seq)
            if key and key not in seen:
                seen.add(key)
                out.append(list(key))

        for s in self.dry_sequence_breakers:
            add(encode(s))
        if pieces is not None and self.dry_sequence_breakers:
            for tid, text in enumerate(pieces):
                if any(b in text for b in self.dry_sequence_breakers):
                    add((tid,))
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-able) that :meth:`from_dict` and ``_native.Sampler`` accept."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["logit_bias"] = sorted(self.logit_bias.items())
        d["banned_tokens"] = list(self.banned_tokens)
        d["dry_sequence_breakers"] = list(self.dry_sequence_breakers)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SamplerConfig:
        """Inverse of :meth:`to_dict`; also takes JSON-decoded data. Missing keys keep defaults."""
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ParameterError(f"unknown sampler fields: {', '.join(sorted(unknown))}")
        kw = dict(d)
        if "logit_bias" in kw:
            lb = kw["logit_bias"]
            if isinstance(lb, Mapping):
                kw["logit_bias"] = _bias(lb.items())
            else:
                pairs = list(lb) if isinstance(lb, Iterable) else [lb]
                if not all(isinstance(p, Sequence) and len(p) == 2 for p in pairs):
                    raise _bad("logit_bias", "(token id, bias) pairs", lb)
                kw["logit_bias"] = _bias((p[0], p[1]) for p in pairs)
        return cls(**kw)


def build_sampler(config: SamplerConfig, tokenizer: Tokenizer, vocab_size: int) -> _native.Sampler:
    """A live sampler for ``config`` over a vocabulary of ``vocab_size``
    (token ids checked; DRY breakers tokenized with ``tokenizer``)."""
    config = config.seeded()
    config.validate(vocab_size)
    breakers = [
        tokenizer.encode(s, add_special=False, parse_special=False)
        for s in config.dry_sequence_breakers
    ]
    return _native.Sampler(config.to_dict(), vocab_size, breakers)
