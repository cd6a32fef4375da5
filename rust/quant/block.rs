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

/// Rounds half away from zero, like C's `roundf`, which ggml uses.
#[inline]
pub fn round_i8(v: f32) -> i8 {
    v.round() as i8
}
