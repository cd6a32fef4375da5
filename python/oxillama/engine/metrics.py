"""The running totals :meth:`oxillama.Engine.metrics` reports, under the
names :meth:`oxillama.AsyncEngine.metrics` uses for the same figures."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineMetrics"]


@dataclass
class EngineMetrics:
    calls: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    #: Chat prompt tokens whose KV the context already held (the engine's
    #: own kept prefix; it has no shared prefix cache).
    reused_prompt_tokens: int = 0

    def record(
        self, prompt_tokens: int, prefill_seconds: float, generated: int, decode_seconds: float
    ) -> None:
        self.calls += 1
        self.prompt_tokens += prompt_tokens
        self.prefill_seconds += prefill_seconds
        self.generated_tokens += generated
        self.decode_seconds += decode_seconds

    def as_dict(self) -> dict[str, float | int]:
        def rate(n: int, s: float) -> float:
            return n / s if s > 0 else 0.0

        return {
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds,
            "prompt_tokens_per_second": rate(self.prompt_tokens, self.prefill_seconds),
            "decode_tokens_per_second": rate(self.generated_tokens, self.decode_seconds),
            "prefix_cache_enabled": 0,
            "reused_prompt_tokens": self.reused_prompt_tokens,
        }
