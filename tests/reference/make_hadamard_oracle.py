"""Writes ``hadamard_oracle.txt``: the orthonormal Walsh-Hadamard matrix
times a few vectors, in float64 with numpy (the oracle of the Rust
transform in rust/ops/hadamard.rs, which reads this file in a unit test).

    python tests/reference/make_hadamard_oracle.py

The matrix is built by Kronecker products of ``[[1, 1], [1, -1]]`` (no
fast transform involved) and scaled by ``1/sqrt(n)``. Inputs are multiples
of 1/1024 in [-4, 4], exact in f32 and in decimal. Each case is three
lines: ``n``, the ``n`` inputs, the ``n`` outputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

OUT = Path(__file__).parent / "hadamard_oracle.txt"
SIZES = (64, 64, 128, 256)


def hadamard(n: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), h)
    return h / np.sqrt(n)


def main() -> None:
    rng = np.random.default_rng(36)
    lines = ["# n, then n inputs, then H @ inputs (float64); see make_hadamard_oracle.py"]
    for i, n in enumerate(SIZES):
        x = rng.integers(-4096, 4097, size=n) / 1024.0
        if i == 1:
            # An outlier channel, as keys have: the case the rotation is for.
            x[5] = 40.0
        y = hadamard(n) @ x
        lines += [str(n), " ".join(repr(float(v)) for v in x), " ".join(repr(float(v)) for v in y)]
    OUT.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
