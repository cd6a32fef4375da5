//! F32, F16 and BF16 weights. Activations stay f32 for these formats: the
//! weights were not quantized, so neither are the inputs.

use half::{bf16, f16};

fn rd_f32(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

pub fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (i, d) in dst.iter_mut().enumerate() {
        *d = rd_f32(src, i);
    }
}

pub fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
    }
}

pub fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
    }
}

/// "Quantizing" activations for float weights: their f32 LE bytes.
pub fn quantize_act_f32(src: &[f32], dst: &mut [u8]) {
    for (d, s) in dst.chunks_exact_mut(4).zip(src) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

pub fn vec_dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    (0..n).map(|i| rd_f32(w, i) * rd_f32(a, i)).sum()
}

pub fn vec_dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    (0..n)
        .map(|i| {
            f16::from_bits(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])).to_f32() * rd_f32(a, i)
        })
        .sum()
}

pub fn vec_dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    (0..n)
        .map(|i| {
            bf16::from_bits(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])).to_f32() * rd_f32(a, i)
        })
        .sum()
}
