//! BF16 weights (bfloat16, little-endian) against f32 activations.

use super::float::{bf16_to_f32, f32_elem};

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    (0..n)
        .map(|i| bf16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])) * f32_elem(a, i))
        .sum()
}
