//! Q8_K: activation format of the K-quants: f32 scale, 256 int8, and 16
//! partial sums of 16 as i16 (292 bytes).

use super::block::{f32_at, round_i8};
use super::QK_K;

pub const BLOCK: usize = 292;

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f32_at(b, 0);
        for (x, &q) in o.iter_mut().zip(&b[4..260]) {
            *x = d * (q as i8) as f32;
        }
    }
}

/// The signed value of largest magnitude in `x` (the first one on ties).
#[inline]
pub fn signed_max(x: &[f32]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// ggml's `quantize_row_q8_K_ref`: that value maps to -127, `d = 1 / iscale`,
/// nearest-even rounding, and the group sums of the stored quants.
pub fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(BLOCK)) {
        b.fill(0);
        let max = signed_max(x);
        if max == 0.0 {
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b[4..260].iter_mut().zip(x) {
            // |iscale * v| <= 127 (rounded), so ggml's MIN(127, .) never bites.
            *q = round_i8(iscale * v) as u8;
        }
        for g in 0..16 {
            let s: i32 = b[4 + 16 * g..20 + 16 * g]
                .iter()
                .map(|&q| q as i8 as i32)
                .sum();
            b[260 + 2 * g..262 + 2 * g].copy_from_slice(&(s as i16).to_le_bytes());
        }
        b[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}
