"""Weight matrices in every GGML format: which matrix gets which format, and
its bytes.

gguf.quants quantizes the float and 32-element-block formats. It cannot
quantize the K-quants, so for those the blocks are written directly: random
quant bits under chosen sub-block scales (and mins that centre each
sub-block on zero), with the f16 super-block scales then set so the matrix
has the intended standard deviation. Both engines read the same bytes, which
is all a reference comparison needs."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from tests.models._iq_blocks import NEW_TYPES, encode_new_type

# The cycle each fixture walks, from its own starting offset.
FORMATS: tuple[Q, ...] = (
    Q.F32,
    Q.F16,
    Q.BF16,
    Q.Q4_0,
    Q.Q4_1,
    Q.Q5_0,
    Q.Q5_1,
    Q.Q8_0,
    Q.Q2_K,
    Q.Q3_K,
    Q.Q4_K,
    Q.Q5_K,
    Q.Q6_K,
)
K_QUANTS = frozenset({Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K})
BLOCK_32 = frozenset({Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0})

# K-quant block sizes in bytes, and the byte offsets of the f16 fields that
# scale every value of the block (d, and dmin where the format has one).
K_BYTES = {Q.Q2_K: 84, Q.Q3_K: 110, Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210}
K_SCALE_FIELDS = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


# Float formats take 2 or 4 bytes a weight: they go only to matrices this
# small, which keeps every fixture a few hundred KB.
FLOAT_MAX_WEIGHTS = 32768


def fits(fmt: Q, shape: tuple[int, ...]) -> bool:
    """Whether a matrix of numpy shape (..., ne0) may be stored in ``fmt``."""
    ne0 = shape[-1]
    if fmt in K_QUANTS:
        return ne0 % 256 == 0
    if fmt in BLOCK_32:
        return ne0 % 32 == 0
    return int(np.prod(shape)) <= FLOAT_MAX_WEIGHTS


def assign_formats(shapes: list[tuple[int, ...]], start: int) -> list[Q]:
    """Round-robin over FORMATS from ``start``: each matrix takes the
    earliest pending format that fits it, so a format a matrix cannot hold
    waits for the next one that can instead of being skipped."""
    pending: list[Q] = []
    nxt = start
    out: list[Q] = []
    for shape in shapes:
        while not any(fits(f, shape) for f in pending):
            pending.append(FORMATS[nxt % len(FORMATS)])
            nxt += 1
        fmt = next(f for f in pending if fits(f, shape))
        pending.remove(fmt)
        out.append(fmt)
    return out


def n_bytes(fmt: Q, shape: tuple[int, ...]) -> int:
    block, size = GGML_QUANT_SIZES[fmt]
    return int(np.prod(shape)) // block * size


def best_start(shapes: list[tuple[int, ...]], preferred: int) -> int:
    """The cycle offset whose assignment covers the most formats in the
    fewest bytes; among equals, the first from ``preferred`` on."""

    def cost(k: int) -> tuple[int, int]:
        fmts = assign_formats(shapes, k)
        return -len(set(fmts)), sum(n_bytes(f, s) for f, s in zip(fmts, shapes, strict=True))

    n = len(FORMATS)
    return min(((preferred + i) % n for i in range(n)), key=cost)


def _pack_k4_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The 12-byte field holding eight 6-bit scales and eight 6-bit mins
    (Q4_K, Q5_K): sub-blocks 0-3 in the low 6 bits of bytes 0-7, sub-blocks
    4-7 as nibbles in bytes 8-11 with their top 2 bits in the high bits of
    bytes 0-7. ``sc`` and ``m`` are (n_blocks, 8)."""
    q = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    q[:, 0:4] = sc[:, 0:4]
    q[:, 4:8] = m[:, 0:4]
    q[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    q[:, 0:4] |= (sc[:, 4:8] >> 4) << 6
    q[:, 4:8] |= (m[:, 4:8] >> 4) << 6
    return q


def _f16(x: float, n: int) -> np.ndarray:
    return np.full((n, 1), x, dtype=np.float16).view(np.uint8)


def k_quant_blocks(fmt: Q, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks with unit super-block scales: (n_blocks, bytes)."""
    b = rng.integers(0, 256, (n_blocks, K_BYTES[fmt]), dtype=np.uint8)
    if fmt == Q.Q2_K:
        # value = d*s*q - dmin*m with q in 0..3; m = s and dmin = 1.5*d
        # centre every sub-block on zero.
        s = rng.integers(4, 16, (n_blocks, 16), dtype=np.uint8)
        b[:, 0:16] = s | (s << 4)
        b[:, 80:82], b[:, 82:84] = _f16(1.0, n_blocks), _f16(1.5, n_blocks)
    elif fmt == Q.Q3_K:
        # Signed 6-bit scales and signed quants: random bits are centred.
        b[:, 108:110] = _f16(1.0, n_blocks)
    elif fmt in (Q.Q4_K, Q.Q5_K):
        # value = d*sc*q - dmin*m; m = sc and dmin = d*(q_max/2) centre it.
        sc = rng.integers(16, 64, (n_blocks, 8), dtype=np.uint8)
        b[:, 4:16] = _pack_k4_scales(sc, sc)
        half = 7.5 if fmt == Q.Q4_K else 15.5
        b[:, 0:2], b[:, 2:4] = _f16(1.0, n_blocks), _f16(half, n_blocks)
    else:  # Q6_K: value = d*sc*(q - 32), int8 sub-block scales.
        sc = rng.integers(8, 64, (n_blocks, 16)) * rng.choice([-1, 1], (n_blocks, 16))
        b[:, 192:208] = sc.astype(np.int8).view(np.uint8)
        b[:, 208:210] = _f16(1.0, n_blocks)
    return b


def encode(w: np.ndarray, fmt: Q, rng: np.random.Generator) -> np.ndarray:
    """A float matrix (..., ne0) in ``fmt``, as an array of the same leading
    shape. For K-quants only its standard deviation is kept: the values are
    random."""
    if fmt == Q.F32:
        return w.astype(np.float32)
    if fmt == Q.F16:
        return w.astype(np.float16)
    if w.ndim > 2:
        flat = encode(w.reshape(-1, w.shape[-1]), fmt, rng)
        return flat.reshape(*w.shape[:-1], flat.shape[-1])
    ne1, ne0 = w.shape
    if fmt in NEW_TYPES:
        return encode_new_type(w, fmt, rng)
    if fmt not in K_QUANTS:
        return quantize(w.astype(np.float32), fmt)
    blocks = k_quant_blocks(fmt, ne1 * ne0 // 256, rng)
    got = float(dequantize(blocks.reshape(ne1, -1), fmt).std())
    factor = float(w.std()) / got
    for off in K_SCALE_FIELDS[fmt]:
        f = blocks[:, off : off + 2].copy().view(np.float16).astype(np.float32) * factor
        blocks[:, off : off + 2] = f.astype(np.float16).view(np.uint8)
    return blocks.reshape(ne1, -1)
