//! F32 weights and the helpers the float formats share. Activations stay
//! f32 for every float format: the weights were not quantized, so neither
//! are the inputs (`quantize_act` writes their little-endian bytes).

use half::{bf16, f16};

/// Element `i` of a little-endian f32 array.
#[inline]
pub fn f32_elem(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// IEEE half bits to f32 (exact).
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// bfloat16 bits to f32 (exact: the high half of an f32).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    bf16::from_bits(bits).to_f32()
}

pub fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// "Quantizing" activations for float weights: their f32 LE bytes.
pub fn quantize_act_f32(src: &[f32], dst: &mut [u8]) {
    for (d, s) in dst.chunks_exact_mut(4).zip(src) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

pub fn vec_dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    (0..n).map(|i| f32_elem(w, i) * f32_elem(a, i)).sum()
}
