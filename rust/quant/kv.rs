//! Q8_0 and Q4_0 rows of the KV cache.
//!
//! The cache's quantizers follow ggml's reference quantizers exactly (the
//! scale's inverse taken as `1 / d`, halves rounded away from zero in Q8_0,
//! Q4_0's scale signed so the largest magnitude maps to -8), so a row's
//! bytes are those llama.cpp's `quantize_row_*_ref` and gguf-py give it.
//! The activation quantizer in `q8_0` instead follows ggml's x86 SIMD path,
//! which our matmuls must match; the two differ on exact ties only.

use super::block::put_f16;

/// Elements per block.
pub const QK: usize = 32;
pub const Q8_0_BLOCK: usize = 34;
pub const Q4_0_BLOCK: usize = 18;

/// Quantizes `src` (a multiple of 32 elements) into Q8_0 blocks.
pub fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    debug_assert_eq!(dst.len(), src.len() / QK * Q8_0_BLOCK);
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_0_BLOCK)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, 0, d);
        for (q, &v) in b[2..].iter_mut().zip(x) {
            // `f32::round` rounds halves away from zero, as C's `roundf`.
            *q = (v * id).round() as i8 as u8;
        }
    }
}

/// Quantizes `src` (a multiple of 32 elements) into Q4_0 blocks.
pub fn quantize_q4_0(src: &[f32], dst: &mut [u8]) {
    debug_assert_eq!(dst.len(), src.len() / QK * Q4_0_BLOCK);
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q4_0_BLOCK)) {
        // The first element of largest magnitude, with its sign: the scale
        // is negative for a positive maximum so that it lands on -8, the
        // end of the range with one more step.
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, 0, d);
        let nib = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        for j in 0..QK / 2 {
            b[2 + j] = nib(x[j]) | (nib(x[j + QK / 2]) << 4);
        }
    }
}

pub fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    super::q8_0::dequantize(src, dst);
}

pub fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    super::q4_0::dequantize(src, dst);
}

/// Rounds `x` in place through Q8_0 as ggml quantizes a query before its
/// dot products with a Q8_0 or Q4_0 key cache (its activation quantizer).
pub fn round_through_q8_0(x: &mut [f32]) {
    let mut b = vec![0u8; x.len() / QK * Q8_0_BLOCK];
    super::q8_0::quantize(x, &mut b);
    super::q8_0::dequantize(&b, x);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_blocks() {
        let mut x = [0f32; 32];
        x[0] = 1.0;
        x[1] = -0.5;
        x[31] = 0.25;
        let mut b = [0u8; Q8_0_BLOCK];
        quantize_q8_0(&x, &mut b);
        // d = 1/127; 0.5 * 127 = 63.5 rounds away from zero.
        assert_eq!(b[2] as i8, 127);
        assert_eq!(b[3] as i8, -64);
        assert_eq!(b[33] as i8, 32);
        let mut b4 = [0u8; Q4_0_BLOCK];
        quantize_q4_0(&x, &mut b4);
        // d = -1/8: 1.0 -> -8 + 8 = 0; -0.5 -> 4 + 8 = 12; 0.25 -> -2 + 8 = 6.
        assert_eq!(b4[2] & 0x0f, 0);
        assert_eq!(b4[3] & 0x0f, 12);
        assert_eq!(b4[17] >> 4, 6);
        let zeros = [0f32; 32];
        quantize_q4_0(&zeros, &mut b4);
        // 0 / -8 is -0: ggml stores a negative zero scale.
        assert_eq!(&b4[..2], &[0x00, 0x80]);
        assert!(b4[2..].iter().all(|&v| v == 0x88));
        let mut y = [0f32; 32];
        dequantize_q4_0(&b4, &mut y);
        assert!(y.iter().all(|&v| v == 0.0));
    }
}
