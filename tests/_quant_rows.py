"""Deterministic float rows for the quantizer tests, from a hash stream and
only the four exactly rounded operations, so every machine and numpy makes
the same floats (no log or cos whose last bit may vary)."""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

N_PER_ROW = 512
N_ROWS = 48


def _uniform(seed: str, n: int) -> npt.NDArray[np.float64]:
    raw = hashlib.shake_256(seed.encode()).digest(4 * n)
    return np.frombuffer(raw, dtype="<u4").astype(np.float64) / 2.0**32


def _bell(seed: str, n: int) -> npt.NDArray[np.float64]:
    """A bell-shaped sample in about [-2, 2]: the sum of four uniforms."""
    u = _uniform(seed, 4 * n).reshape(4, n)
    out: npt.NDArray[np.float64] = u.sum(axis=0) - 2.0
    return out


def rows(kind: str = "mixed") -> npt.NDArray[np.float32]:
    """`N_ROWS` rows of `N_PER_ROW` floats covering what trips quantizers:
    bell and heavy-tailed values at scales from 1e-3 to 10, lone outliers,
    all-zero, constant, all-positive and all-negative blocks, tiny values
    below ggml's zero threshold, and values on a grid (as in a tensor that
    was quantized before)."""
    n = N_PER_ROW
    out = np.empty((N_ROWS, n), dtype=np.float64)
    for r in range(N_ROWS):
        s = f"{kind}:{r}"
        scale = [1e-3, 0.02, 0.5, 10.0][r % 4]
        b = _bell(s, n)
        style = (r // 4) % 12
        if style == 0:
            v = b
        elif style == 1:
            v = b * b * b
        elif style == 2:
            v = b.copy()
            v[int(_uniform(s + "o", 1)[0] * n)] = 40.0
        elif style == 3:
            v = b.copy()
            v[32:64] = 0.0
            v[256:512] = 0.0
        elif style == 4:
            v = b.copy()
            v[0:32] = 0.75
            v[64:96] = -0.25
        elif style == 5:
            v = np.abs(b) + 0.5
        elif style == 6:
            v = -np.abs(b) - 0.125
        elif style == 7:
            v = b * 1e-17
        elif style == 8:
            v = np.round(b * 7.0) / 7.0
        elif style == 9:
            v = np.round(b * 15.0) / 16.0
        elif style == 10:
            v = b.copy()
            v[::2] = 0.0
        else:
            v = np.where(b > 0, b * b, -b * b * 0.3)
        out[r] = v * scale
    return out.astype(np.float32)


def importance(kind: str = "imatrix") -> npt.NDArray[np.float32]:
    """One positive weight per column (a few zeros), as an imatrix holds."""
    u = _uniform(kind, N_PER_ROW)
    w = u * u * 50.0
    w[::37] = 0.0
    return w.astype(np.float32)
