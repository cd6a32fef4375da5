//! Q8_0: blocks of 32 int8 with one f16 scale (34 bytes). Also the
//! activation format for Q4_0, Q5_0 and Q8_0 weights.

use super::block::{f16_at, put_f16, q8_scales, round_i8};

pub const QK: usize = 32;
pub const BLOCK: usize = 34;

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (x, &q) in o.iter_mut().zip(&b[2..]) {
            *x = d * (q as i8) as f32;
        }
    }
}

pub fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let (d, id) = q8_scales(amax);
        put_f16(b, 0, d);
        for (q, &v) in b[2..].iter_mut().zip(x) {
            *q = round_i8(v * id) as u8;
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w
        .chunks_exact(BLOCK)
        .zip(a.chunks_exact(BLOCK))
        .take(n / QK)
    {
        let s: i32 = bw[2..]
            .iter()
            .zip(&ba[2..])
            .map(|(&x, &y)| (x as i8 as i32) * (y as i8 as i32))
            .sum();
        sum += f16_at(bw, 0) * f16_at(ba, 0) * s as f32;
    }
    sum
}
