//! Q4_1: 32 weights as 4-bit values with an f16 scale and f16 minimum
//! (20 bytes). Byte j holds element j in its low nibble and j+16 in its high.
//! Dot products pair it with Q8_1 activations.

use super::block::f16_at;

pub const QK: usize = 32;
pub const BLOCK: usize = 20;

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for j in 0..16 {
            o[j] = d * (b[4 + j] & 0x0f) as f32 + m;
            o[j + 16] = d * (b[4 + j] >> 4) as f32 + m;
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w
        .chunks_exact(BLOCK)
        .zip(a.chunks_exact(super::q8_1::BLOCK))
        .take(n / QK)
    {
        let q8 = &ba[4..];
        let mut s = 0i32;
        for j in 0..16 {
            s += (bw[4 + j] & 0x0f) as i32 * (q8[j] as i8 as i32);
            s += (bw[4 + j] >> 4) as i32 * (q8[j + 16] as i8 as i32);
        }
        sum += f16_at(bw, 0) * f16_at(ba, 0) * s as f32 + f16_at(bw, 2) * f16_at(ba, 2);
    }
    sum
}
