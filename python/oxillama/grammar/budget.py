"""Constrained output that still ends inside ``max_tokens``.

A sampled token is kept only if the grammar can still be finished in the
tokens left after it: its shortest completion (in bytes), spelled with as
few vocabulary tokens as possible, must fit. Otherwise the token is drawn
again from the tokens that start that completion and keep it within the
budget, which brings the end one step closer each time. So a document
that fits is always completed; without this, a JSON Schema generation that
runs out of tokens returns JSON cut in the middle.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .. import _native
from ..errors import GenerateError

__all__ = ["sample_within_budget"]


def _padded(mask: bytes, vocab_size: int) -> bytes:
    need = (vocab_size + 7) // 8
    return mask if len(mask) >= need else mask.ljust(need, b"\0")


def sample_within_budget(
    sampler: _native.Sampler,
    matcher: _native.GrammarMatcher,
    logits: npt.NDArray[np.float32],
    allowed: bytes,
    vocab_size: int,
    left: int,
) -> tuple[int, bool]:
    """Samples under ``allowed`` and advances ``matcher`` by the token; when
    ``left`` (tokens that may still be generated, this one included) would
    no longer fit the grammar's shortest completion, samples again from the
    shortest-completion tokens. Returns the token and whether the budget
    chose it."""
    tok = int(sampler.sample(logits, allowed))
    if not matcher.accept_token(tok):
        raise GenerateError(f"internal error: sampled token {tok} the grammar refuses")
    # Bytes bound tokens from above (single-byte tokens spell anything), so
    # the usual case is settled without spelling a completion out.
    bytes_needed = matcher.min_completion_bytes()
    if bytes_needed is None or bytes_needed <= left - 1:
        return tok, False
    need = matcher.min_completion_tokens()
    if need is None or need <= left - 1:
        return tok, False
    matcher.rollback(1)
    path = matcher.shortest_path_mask(left)
    if path is None:
        # Not spelled as text from here (mid-character): keep the draw.
        matcher.accept_token(tok)
        return tok, False
    tok = int(sampler.sample(logits, _padded(path, vocab_size)))
    if not matcher.accept_token(tok):
        raise GenerateError(f"internal error: budget token {tok} the grammar refuses")
    return tok, True
