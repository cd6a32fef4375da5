"""Token log-probabilities in the OpenAI response shapes: the legacy
completions object (parallel lists) and chat's ``content`` entries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from oxillama.decoding.completion import TokenLogprob

if TYPE_CHECKING:
    from oxillama.text.tokenizer import Tokenizer

__all__ = ["chat_logprobs", "completion_logprobs"]


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


def completion_logprobs(
    lps: Sequence[TokenLogprob], tok: Tokenizer, offset: int = 0
) -> dict[str, Any]:
    """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``;
    offsets count characters of the generated text from ``offset``."""
    texts = [_text(t.bytes) for t in lps]
    offsets, done = [], b""
    for t in lps:
        offsets.append(offset + len(done.decode("utf-8", errors="ignore")))
        done += t.bytes
    return {
        "tokens": texts,
        "token_logprobs": [t.logprob for t in lps],
        "top_logprobs": [
            {_text(tok.token_to_piece(i)): lp for i, lp in reversed(t.top)} for t in lps
        ],
        "text_offset": offsets,
    }


def _entry(token: int, lp: float, tok: Tokenizer) -> dict[str, Any]:
    b = tok.token_to_piece(token)
    return {"token": _text(b), "logprob": lp, "bytes": list(b)}


def chat_logprobs(lps: Sequence[TokenLogprob], tok: Tokenizer) -> dict[str, Any]:
    """``{"content": [...], "refusal": None}`` with each token's entry and
    its ``top_logprobs`` (most likely first)."""
    return {
        "content": [
            {
                **_entry(t.token, t.logprob, tok),
                "top_logprobs": [_entry(i, lp, tok) for i, lp in t.top],
            }
            for t in lps
        ],
        "refusal": None,
    }
