"""Block keys: the hash chain of a prompt's tokens under the identity of
everything that changes the KV they produce.

The chain runs over pages of ``PAGE`` tokens: ``h[0]`` digests the context
(model fingerprint, KV types and rotation, RoPE settings, LoRA stack, the
block sizes), and ``h[i+1] = BLAKE3(h[i] || tokens of page i)``. A block
holds the positions of up to ``CHUNK`` tokens starting at a multiple of
``CHUNK`` and is keyed by the hash of its last page, which covers every
token from 0 to its end: two prompts share a block only when they agree on
all of them, on the same model, KV types and adapters.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import oxillama._native as _native

#: Positions per stored block: 16 KV pages. A SmolLM2 f16 block is about
#: 5.9 MB, so a 4,000-token prompt is 16 files, not 250 tiny ones.
CHUNK = 256
#: The granularity of keys, and of the last, partial block of a prompt
#: (its KV pages): a restored prompt leaves fewer than 16 tokens to prefill.
PAGE = 16
PAGES_PER_CHUNK = CHUNK // PAGE

#: Bumped whenever the block layout or the key derivation changes.
FORMAT = 1


@dataclass(frozen=True)
class StoreContext:
    """What the KV of a token sequence depends on besides the tokens."""

    model: dict[str, Any]
    kv_dtype: str
    kv_rot: tuple[int, int]
    rope: dict[str, Any]
    loras: tuple[tuple[str, float], ...]

    def root(self) -> bytes:
        ident = {
            "format": FORMAT,
            "chunk": CHUNK,
            "page": PAGE,
            "model": self.model,
            "kv_dtype": self.kv_dtype,
            "kv_rot": list(self.kv_rot),
            "rope": self.rope,
            "loras": [list(x) for x in self.loras],
        }
        return bytes(_native.blake3(json.dumps(ident, sort_keys=True).encode()))


def chain(root: bytes, tokens: Sequence[int], n_pages: int) -> list[bytes]:
    """The keys of the first ``n_pages`` pages of ``tokens``: entry ``i``
    covers tokens ``0 .. (i+1)*PAGE``."""
    toks = np.asarray(tokens[: n_pages * PAGE], dtype="<u4").tobytes()
    keys: list[bytes] = []
    h = root
    step = PAGE * 4
    for i in range(n_pages):
        h = bytes(_native.blake3(h + toks[i * step : (i + 1) * step]))
        keys.append(h)
    return keys
