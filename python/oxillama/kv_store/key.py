"""Block keys: the hash chain of a prompt's tokens under the identity of
everything that changes the KV they produce.

Block ``i`` holds positions ``[i*CHUNK, (i+1)*CHUNK)`` and its key covers
tokens ``0 .. (i+1)*CHUNK``: ``h[0]`` digests the context (model fingerprint,
KV types and rotation, RoPE settings, LoRA stack, the block size), and
``h[i+1] = BLAKE3(h[i] || tokens of block i)``. Two prompts share block
``i`` only when they agree on every token up to its end, on the same model,
KV types and adapters.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import oxillama._native as _native

#: Positions per stored block: 16 KV pages. A SmolLM2 f16 block is about
#: 5.9 MB, so a 4,000-token prompt is 15 files, not 250 tiny ones, and a
#: prompt that diverges late loses at most 255 tokens of reuse.
CHUNK = 256

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
            "model": self.model,
            "kv_dtype": self.kv_dtype,
            "kv_rot": list(self.kv_rot),
            "rope": self.rope,
            "loras": [list(x) for x in self.loras],
        }
        return bytes(_native.blake3(json.dumps(ident, sort_keys=True).encode()))


def chain(root: bytes, tokens: Sequence[int], n_blocks: int) -> list[bytes]:
    """The keys of the first ``n_blocks`` blocks of ``tokens``."""
    toks = np.asarray(tokens[: n_blocks * CHUNK], dtype="<u4")
    keys: list[bytes] = []
    h = root
    for i in range(n_blocks):
        h = bytes(_native.blake3(h + toks[i * CHUNK : (i + 1) * CHUNK].tobytes()))
        keys.append(h)
    return keys
