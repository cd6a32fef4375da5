//! Q8_1: Q8_0 plus `s = d * sum(q)` per block (36 bytes), so formats with a
//! minimum (Q4_1, Q5_1) fold it in with one multiply per block.

use super::block::{f16_at, put_f16, q8_scales, round_i8};

pub const QK: usize = 32;
pub const BLOCK: usize = 36;

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (x, &q) in o.iter_mut().zip(&b[4..]) {
            *x = d * (q as i8) as f32;
        }
    }
}

pub fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let (d, id) = q8_scales(amax);
        let mut sum = 0i32;
        for (q, &v) in b[4..].iter_mut().zip(x) {
            let qi = round_i8(v * id);
            sum += qi as i32;
            *q = qi as u8;
        }
        put_f16(b, 0, d);
        put_f16(b, 2, sum as f32 * d);
    }
}
