"""Weight matrices in the i-quants, the ternary types and MXFP4.

gguf.quants cannot quantize the grid types (IQ4_XS, IQ3_S, IQ3_XXS, IQ2_S,
IQ2_XS, IQ2_XXS, IQ1_S, IQ1_M) nor IQ4_NL, but every byte pattern of their
index, sign and sub-block scale fields is a valid block, so random bytes
are written and the f16 block scale ``d`` then set for the matrix's
intended standard deviation. IQ1_M has no ``d`` field of its own: its f16
scale lives in the top nibbles of its four 16-bit scale words. TQ1_0, TQ2_0
and MXFP4 go through gguf.quants from Gaussian weights (random bytes would
not be ternary, and MXFP4's first byte is an e8m0 exponent that must stay
near 127 for weights near 1)."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

# The twelve types, in the order the fixtures and docs list them.
NEW_TYPES: tuple[Q, ...] = (
    Q.IQ4_NL,
    Q.IQ4_XS,
    Q.IQ3_S,
    Q.IQ3_XXS,
    Q.IQ2_S,
    Q.IQ2_XS,
    Q.IQ2_XXS,
    Q.IQ1_S,
    Q.IQ1_M,
    Q.TQ1_0,
    Q.TQ2_0,
    Q.MXFP4,
)
# Types gguf.quants writes from floats; the rest are random blocks.
QUANTIZED_BY_GGUF = frozenset({Q.TQ1_0, Q.TQ2_0, Q.MXFP4})
# Byte offset of the f16 block scale, for the types that have one field.
D_OFFSET = {
    Q.IQ4_NL: 0,
    Q.IQ4_XS: 0,
    Q.IQ3_S: 0,
    Q.IQ3_XXS: 0,
    Q.IQ2_S: 0,
    Q.IQ2_XS: 0,
    Q.IQ2_XXS: 0,
    Q.IQ1_S: 0,
}
IQ1_M_SCALES = 48  # the four scale words, d's nibbles in their top bits


def block_elements(fmt: Q) -> int:
    return GGML_QUANT_SIZES[fmt][0]


def _get_d(blocks: np.ndarray, fmt: Q) -> np.ndarray:
    if fmt == Q.IQ1_M:
        words = blocks[:, IQ1_M_SCALES : IQ1_M_SCALES + 8].copy().view(np.uint16)
        bits = np.zeros(len(blocks), dtype=np.uint16)
        for i in range(4):
            bits |= (words[:, i] >> 12) << (4 * i)
        d: np.ndarray = bits.view(np.float16).astype(np.float32)
        return d
    off = D_OFFSET[fmt]
    field: np.ndarray = blocks[:, off : off + 2].copy().view(np.float16).astype(np.float32)
    return field.ravel()


def _set_d(blocks: np.ndarray, fmt: Q, d: np.ndarray) -> None:
    bits = d.astype(np.float16).view(np.uint16)
    if fmt == Q.IQ1_M:
        words = blocks[:, IQ1_M_SCALES : IQ1_M_SCALES + 8].copy().view(np.uint16)
        for i in range(4):
            words[:, i] = (words[:, i] & 0x0FFF) | (((bits >> (4 * i)) & 0xF) << 12)
        blocks[:, IQ1_M_SCALES : IQ1_M_SCALES + 8] = words.view(np.uint8)
        return
    off = D_OFFSET[fmt]
    blocks[:, off : off + 2] = bits.reshape(-1, 1).view(np.uint8)


def random_blocks(fmt: Q, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of a grid type (or IQ4_NL) with block scales of +-1:
    (n_blocks, bytes). The sign of ``d`` is random so IQ4_NL's slightly
    lopsided codebook still gives weights centred on zero."""
    size = GGML_QUANT_SIZES[fmt][1]
    b = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    _set_d(b, fmt, rng.choice(np.array([-1.0, 1.0], dtype=np.float32), n_blocks))
    return b


def encode_new_type(w: np.ndarray, fmt: Q, rng: np.random.Generator) -> np.ndarray:
    """A float matrix (ne1, ne0) in one of NEW_TYPES, as (ne1, row bytes).
    For the random-block types only the standard deviation is kept."""
    ne1, ne0 = w.shape
    if fmt in QUANTIZED_BY_GGUF:
        return quantize(w.astype(np.float32), fmt)
    blocks = random_blocks(fmt, ne1 * ne0 // block_elements(fmt), rng)
    got = float(dequantize(blocks.reshape(ne1, -1), fmt).std())
    _set_d(blocks, fmt, _get_d(blocks, fmt) * (float(w.std()) / got))
    return blocks.reshape(ne1, -1)
