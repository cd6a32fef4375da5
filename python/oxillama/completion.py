"""Result objects returned by generation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Completion", "FinishReason", "Timings"]

FinishReason = Literal["stop", "length", "eos"]


@dataclass(frozen=True)
class Timings:
    """Wall-clock timings of one generation call."""

    prompt_tokens: int
    prompt_seconds: float
    decode_tokens: int
    decode_seconds: float

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


@dataclass(frozen=True)
class Completion:
    """The outcome of :meth:`oxillama.Engine.generate`.

    ``finish_reason`` is ``"eos"`` when the model ended its turn, ``"stop"``
    when a stop string matched (it is cut from ``text``) or ``on_token``
    returned ``False``, and ``"length"`` when ``max_tokens`` or the context
    size was reached. ``seed`` is the sampler's seed (drawn from the OS when
    the config had none): the same seed, prompt and config repeat the text.
    """

    text: str
    tokens: list[int]
    finish_reason: FinishReason
    timings: Timings = field(repr=False)
    seed: int | None = None

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.timings.prompt_tokens_per_second

    @property
    def decode_tokens_per_second(self) -> float:
        return self.timings.decode_tokens_per_second
