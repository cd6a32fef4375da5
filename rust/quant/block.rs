//! Helpers shared by the block formats.

use half::f16;

#[inline]
pub fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

#[inline]
pub fn put_f16(b: &mut [u8], i: usize, v: f32) {
    b[i..i + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

/// Rounds half to even, as ggml's x86 SIMD quantizers do (`_mm256_round_ps`
/// with nearest rounding), so our activations match llama.cpp's bit for bit.
#[inline]
pub fn round_i8(v: f32) -> i8 {
    v.round_ties_even() as i8
}

/// Scale and inverse scale for a symmetric 8-bit block with maximum `amax`,
/// computed in the same order as ggml (`127 / amax`, not `1 / d`).
#[inline]
pub fn q8_scales(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    (d, id)
}
