"""Sampler configuration. The chain itself runs in Rust (``_native.Sampler``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["SamplerConfig"]


def _bad(name: str, rule: str, value: object) -> ValueError:
    return ValueError(f"{name} must be {rule}, got {value!r}")


@dataclass(frozen=True)
class SamplerConfig:
    """Every stage of the sampler chain, with llama.cpp-like defaults.

    Stages run in this order: logit bias and banned tokens, repetition
    penalty (last ``repetition_penalty_window`` tokens), DRY; then greedy when
    ``temperature == 0``; otherwise top-k, typical-p, top-p, min-p, top-a,
    eta/epsilon cutoffs, XTC, temperature and a seeded draw. ``mirostat=2``
    replaces the truncation stages with Mirostat v2. A stage at its neutral
    value (top_k=0, top_p=1, min_p=0, ...) is off.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repetition_penalty: float = 1.0
    repetition_penalty_window: int = 64
    seed: int = 0
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
        # Normalize containers so equal configs compare equal and the
        # dataclass stays immutable in practice.
        object.__setattr__(self, "logit_bias", dict(self.logit_bias))
        object.__setattr__(self, "banned_tokens", tuple(self.banned_tokens))
        if not isinstance(self.dry_sequence_breakers, str):
            object.__setattr__(self, "dry_sequence_breakers", tuple(self.dry_sequence_breakers))
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float) and math.isnan(v):
                raise _bad(f.name, "a number", v)
        for name in (
            "top_k",
            "repetition_penalty_window",
            "seed",
            "mirostat",
            "dry_allowed_length",
            "dry_penalty_last_n",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise _bad(name, "an integer", v)
        unit = (
            "min_p",
            "xtc_threshold",
            "xtc_probability",
            "top_a",
            "eta_cutoff",
            "epsilon_cutoff",
        )
        checks: list[tuple[str, bool, str]] = [
            ("temperature", self.temperature >= 0 and math.isfinite(self.temperature), ">= 0"),
            ("top_k", self.top_k >= 0, ">= 0 (0 disables it)"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("typical_p", 0 < self.typical_p <= 1, "in (0, 1]"),
            ("repetition_penalty", 0 < self.repetition_penalty < math.inf, "> 0"),
            ("repetition_penalty_window", self.repetition_penalty_window >= 0, ">= 0"),
            ("seed", 0 <= self.seed < 2**64, "in [0, 2**64)"),
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
            *((n, 0 <= getattr(self, n) <= 1, "in [0, 1]") for n in unit),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise _bad(name, rule, getattr(self, name))
        for k, v in dict(self.logit_bias).items():
            if not isinstance(k, int) or k < 0:
                raise _bad("logit_bias", "keyed by non-negative token ids", k)
            if not isinstance(v, (int, float)) or math.isnan(v):
                raise _bad("logit_bias", "valued by numbers", v)
        for t in self.banned_tokens:
            if not isinstance(t, int) or t < 0:
                raise _bad("banned_tokens", "non-negative token ids", t)
        if isinstance(self.dry_sequence_breakers, str):
            raise _bad("dry_sequence_breakers", "a sequence of strings", self.dry_sequence_breakers)

    @classmethod
    def greedy(cls) -> SamplerConfig:
        """Temperature 0: always the most likely token."""
        return cls(temperature=0.0)

    def validate(self, vocab_size: int) -> None:
        """Checks the token ids against a vocabulary size."""
        for k in self.logit_bias:
            if k >= vocab_size:
                raise _bad("logit_bias", f"keyed by token ids < {vocab_size}", k)
        for t in self.banned_tokens:
            if t >= vocab_size:
                raise _bad("banned_tokens", f"token ids < {vocab_size}", t)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["logit_bias"] = sorted((int(k), float(v)) for k, v in dict(self.logit_bias).items())
        d["banned_tokens"] = [int(t) for t in self.banned_tokens]
        d["dry_sequence_breakers"] = list(self.dry_sequence_breakers)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SamplerConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown sampler fields: {', '.join(sorted(unknown))}")
        kw = dict(d)
        if "logit_bias" in kw:
            lb = kw["logit_bias"]
            kw["logit_bias"] = dict(
                lb.items() if isinstance(lb, Mapping) else ((int(k), float(v)) for k, v in lb)
            )
        for key in ("banned_tokens", "dry_sequence_breakers"):
            if key in kw:
                kw[key] = tuple(kw[key])
        return cls(**kw)
