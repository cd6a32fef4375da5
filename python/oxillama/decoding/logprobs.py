"""Per-token log-probabilities for ``generate(..., logprobs=k)`` and the
server's ``logprobs`` / ``top_logprobs`` (the arithmetic is native:
``_native.logprobs``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

import oxillama._native as _native
from oxillama.decoding.completion import TokenLogprob
from oxillama.errors import ParameterError

if TYPE_CHECKING:
    from oxillama.text.tokenizer import Tokenizer

__all__ = ["MAX_TOP_LOGPROBS", "check_logprobs", "token_logprob"]

#: OpenAI's bound on ``top_logprobs``; beyond it the list is noise.
MAX_TOP_LOGPROBS = 20


def check_logprobs(k: object) -> int | None:
    """``None`` (no logprobs) or the number of top alternatives, 0 to 20."""
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TOP_LOGPROBS:
        raise ParameterError(
            f"logprobs must be None or an integer in [0, {MAX_TOP_LOGPROBS}], got {k!r}"
        )
    return k


def token_logprob(
    logits: npt.NDArray[np.float32], token: int, k: int, tokenizer: Tokenizer
) -> TokenLogprob:
    """``token``'s entry under the distribution of ``logits``."""
    lp, top = _native.logprobs(logits, token, k)
    return TokenLogprob(token, tokenizer.token_to_piece(token), lp, tuple(top))
