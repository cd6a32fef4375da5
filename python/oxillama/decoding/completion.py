"""Result objects returned by generation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from oxillama.decoding.tool_calls.detector import ToolCall

__all__ = [
    "Completion",
    "FinishReason",
    "Piece",
    "Speculation",
    "SpeculativeCounts",
    "Timings",
    "TokenLogprob",
]

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
class TokenLogprob:
    """One generated token's log-probability under the model's own
    distribution (``log_softmax`` of the raw logits, before any sampler
    stage or grammar mask), and the ``k`` most likely tokens there, most
    likely first, as ``(token id, logprob)`` pairs."""

    token: int
    #: The token's bytes (a piece of a UTF-8 character is possible).
    bytes: bytes
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    @property
    def text(self) -> str:
        return self.bytes.decode("utf-8", errors="replace")


class Piece(str):
    """A streamed text piece that also carries the log-probabilities of the
    tokens it completes (those generated since the previous piece), when
    the request asked for them. It is a ``str`` in every other respect."""

    logprobs: tuple[TokenLogprob, ...]

    def __new__(cls, text: str, logprobs: tuple[TokenLogprob, ...] = ()) -> Piece:
        self = super().__new__(cls, text)
        self.logprobs = logprobs
        return self


@dataclass(frozen=True)
class SpeculativeCounts:
    """Draft-and-verify rounds and what became of their drafts."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    #: Rounds that ended with a rejected draft.
    rejected: int = 0
    #: Extra tokens drawn from the target after a fully accepted round.
    bonus: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(frozen=True)
class Speculation:
    """A speculative completion's figures: the rounds its own call ran
    (``request``; tokens a round decided but a ``max_tokens`` cut held
    back count where the round ran) and the engine's running totals after
    it (``total``, as ``SpeculativeEngine.stats``)."""

    request: SpeculativeCounts
    total: SpeculativeCounts


@dataclass(frozen=True)
class Completion:
    """The outcome of :meth:`oxillama.Engine.generate`.

    ``finish_reason`` is ``"eos"`` when the model ended its turn, ``"stop"``
    when a stop string matched (it is cut from ``text``) or ``on_token``
    returned ``False``, and ``"length"`` when ``max_tokens`` or the context
    size was reached. ``seed`` is the sampler's seed (drawn from the OS when
    the config had none): the same seed, prompt and config repeat the text.
    ``logprobs`` holds one :class:`TokenLogprob` per token of ``tokens``
    when the call asked for them (``logprobs=k``), else ``None``.
    ``speculation`` is set by :class:`~oxillama.SpeculativeEngine` only;
    ``reasoning`` and ``tool_calls`` by the chat calls only
    (:meth:`~oxillama.Engine.chat`, :meth:`~oxillama.AsyncEngine.chat`,
    :meth:`~oxillama.AsyncSession.chat` and their streams' ``result``).
    """

    text: str
    tokens: list[int]
    finish_reason: FinishReason
    timings: Timings = field(repr=False)
    seed: int | None = None
    logprobs: tuple[TokenLogprob, ...] | None = field(default=None, repr=False)
    speculation: Speculation | None = field(default=None, repr=False)
    #: A thinking model's reasoning, kept apart from ``text`` by the chat
    #: calls (``None`` when the reply had none).
    reasoning: str | None = None
    #: Tool calls a harmony reply (gpt-oss) addressed to functions, parsed
    #: out of ``text`` by the chat calls (empty otherwise).
    tool_calls: tuple[ToolCall, ...] = ()

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.timings.prompt_tokens_per_second

    @property
    def decode_tokens_per_second(self) -> float:
        return self.timings.decode_tokens_per_second
