"""Every tensor format against llama.cpp's own Python dequantizer (gguf)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as ref_dequantize

from oxillama import _native

# Byte offsets of the f16 scale/min fields in each block, and f32 ones.
F16_FIELDS = {
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q8_0: (0,),
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    T.IQ4_NL: (0,),
    T.IQ4_XS: (0,),
    T.IQ3_S: (0,),
    T.IQ3_XXS: (0,),
    T.IQ2_S: (0,),
    T.IQ2_XS: (0,),
    T.IQ2_XXS: (0,),
    T.IQ1_S: (0,),
    T.TQ1_0: (52,),
    T.TQ2_0: (64,),
}
BLOCK = {  # (elements, bytes)
    T.Q4_0: (32, 18),
    T.Q4_1: (32, 20),
    T.Q5_0: (32, 22),
    T.Q5_1: (32, 24),
    T.Q8_0: (32, 34),
    T.Q2_K: (256, 84),
    T.Q3_K: (256, 110),
    T.Q4_K: (256, 144),
    T.Q5_K: (256, 176),
    T.Q6_K: (256, 210),
    T.Q8_K: (256, 292),
    T.IQ4_NL: (32, 18),
    T.MXFP4: (32, 17),
    T.IQ4_XS: (256, 136),
    T.IQ3_S: (256, 110),
    T.IQ3_XXS: (256, 98),
    T.IQ2_S: (256, 82),
    T.IQ2_XS: (256, 74),
    T.IQ2_XXS: (256, 66),
    T.IQ1_M: (256, 56),
    T.IQ1_S: (256, 50),
    T.TQ1_0: (256, 54),
    T.TQ2_0: (256, 66),
}
# The i-quants, ternary types and MXFP4 (the fifth wave's formats).
NEW_TYPES = list(BLOCK)[list(BLOCK).index(T.IQ4_NL) :]


def q8_k_oracle(data: bytes) -> np.ndarray:
    """Q8_K is an activation-only format, so gguf has no dequantizer for it:
    f32 scale, 256 int8, 16 int16 sums per 292-byte block."""
    blocks = np.frombuffer(data, dtype=np.uint8).reshape(-1, 292)
    d = blocks[:, :4].copy().view(np.float32)
    q = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)
    return (d * q).ravel()


def reference(data: bytes, t: T) -> np.ndarray:
    if t == T.Q8_K:
        return q8_k_oracle(data)
    return ref_dequantize(np.frombuffer(data, dtype=np.uint8), t).astype(np.float32).ravel()


def random_blocks(t: T, n_blocks: int, rng: np.random.Generator) -> bytes:
    _qk, size = BLOCK[t]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in F16_FIELDS.get(t, ()):
        vals = rng.uniform(-2, 2, n_blocks).astype(np.float16)
        raw[:, off : off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
    if t == T.MXFP4:
        # Every exponent, the subnormal scales (e = 0, 1) and the largest included.
        raw[:, 0] = rng.integers(0, 256, n_blocks, dtype=np.uint8)
        raw[0, 0], raw[-1, 0] = 0, 254
    if t == T.IQ1_M:
        # The block's f16 scale is spread over the scale words' top nibbles.
        d = rng.uniform(-2, 2, n_blocks).astype(np.float16).view(np.uint16)
        words = raw[:, 48:56].copy().view(np.uint16)
        for i in range(4):
            words[:, i] = (words[:, i] & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12)
        raw[:, 48:56] = words.view(np.uint8)
    if t == T.Q8_K:
        raw[:, 0:4] = (
            rng.uniform(-0.1, 0.1, n_blocks).astype(np.float32).view(np.uint8).reshape(n_blocks, 4)
        )
    return raw.tobytes()


# gguf-py overflows to inf on the largest MXFP4 scales, as ggml does.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("t", list(BLOCK), ids=lambda t: t.name)
@pytest.mark.parametrize("n_blocks", [1, 3, 17])
def test_block_formats_equal_gguf_reference(t: T, n_blocks: int) -> None:
    rng = np.random.default_rng(int(t) * 100 + n_blocks)
    data = random_blocks(t, n_blocks, rng)
    qk, _ = BLOCK[t]
    want = reference(data, t)
    got = _native.dequantize(int(t), data, qk * n_blocks)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("t", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_float_formats_equal_gguf_reference(t: T) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal(1000).astype(np.float32)
    raw = {
        T.F32: x.tobytes(),
        T.F16: x.astype(np.float16).tobytes(),
        T.BF16: (x.view(np.uint32) >> 16).astype(np.uint16).tobytes(),
    }[t]
    want = ref_dequantize(np.frombuffer(raw, dtype=np.uint8), t).astype(np.float32).ravel()
    np.testing.assert_array_equal(_native.dequantize(int(t), raw, 1000), want)


def test_length_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError):
        _native.dequantize(int(T.Q4_K), bytes(143), 256)
    with pytest.raises(ValueError):
        _native.dequantize(4, bytes(18), 32)


@pytest.mark.parametrize(
    "t",
    [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K, T.Q2_K, T.Q3_K, T.Q5_K, *NEW_TYPES],
    ids=lambda t: t.name,
)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_dot_equals_dequantized_reference(t: T) -> None:
    """vec_dot(w, quantize_act(x)) = dequant(w) . dequant(quantize_act(x)),
    and the dispatched (SIMD) kernel equals its scalar twin."""
    rng = np.random.default_rng(int(t))
    qk, _ = BLOCK[t]
    n = qk * 6
    w = random_blocks(t, 6, rng)
    x = rng.standard_normal(n).astype(np.float32)
    a = _native.quantize_act(int(t), x)
    wd = reference(w, t).astype(np.float64)
    act_t = T.Q8_K if qk == 256 else (T.Q8_1 if t in (T.Q4_1, T.Q5_1) else T.Q8_0)
    if t == T.MXFP4:
        # Keep the random power-of-two scales near one, as real weights are.
        blocks = np.frombuffer(w, dtype=np.uint8).reshape(-1, 17).copy()
        blocks[:, 0] = rng.integers(120, 134, len(blocks), dtype=np.uint8)
        w = blocks.tobytes()
        wd = reference(w, t).astype(np.float64)
    if act_t == T.Q8_1:
        # Q8_1 = Q8_0 plus a sum field; gguf reads its values like Q8_0's.
        blocks = np.frombuffer(a, dtype=np.uint8).reshape(-1, 36)
        as_q8_0 = np.concatenate([blocks[:, :2], blocks[:, 4:]], axis=1).tobytes()
        ad = reference(as_q8_0, T.Q8_0).astype(np.float64)
    else:
        ad = reference(a, act_t).astype(np.float64)
    want = float(wd @ ad)
    fast = _native.vec_dot(int(t), w, a, n)
    slow = _native.vec_dot(int(t), w, a, n, scalar=True)
    assert fast == pytest.approx(want, rel=1e-4, abs=1e-3)
    assert fast == pytest.approx(slow, rel=1e-5, abs=1e-4)
    # Activation quantization error stays within 8-bit bounds.
    assert np.abs(ad - x).max() <= np.abs(x).max() / 100


def test_simd_level_is_reported() -> None:
    assert _native.simd_level() in ("avx512vnni", "avx2", "scalar")
