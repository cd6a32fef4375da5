//! Q4_0: 32 weights as 4-bit values offset by 8, one f16 scale (18 bytes).
//! Byte j holds element j in its low nibble and j+16 in its high one.
//! Dot products pair it with Q8_0 activations.

use super::block::f16_at;
use super::q8_0;

pub const QK: usize = 32;
pub const BLOCK: usize = 18;

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for j in 0..16 {
            o[j] = d * ((b[2 + j] & 0x0f) as i32 - 8) as f32;
            o[j + 16] = d * ((b[2 + j] >> 4) as i32 - 8) as f32;
        }
    }
}

/// `sum_blocks (d_w * d_a) * sum_j (q_j - 8) * a_j`, integer inside a block.
pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w
        .chunks_exact(BLOCK)
        .zip(a.chunks_exact(q8_0::BLOCK))
        .take(n / QK)
    {
        let q8 = &ba[2..];
        let mut s = 0i32;
        for j in 0..16 {
            s += ((bw[2 + j] & 0x0f) as i32 - 8) * (q8[j] as i8 as i32);
            s += ((bw[2 + j] >> 4) as i32 - 8) * (q8[j + 16] as i8 as i32);
        }
        sum += s as f32 * f16_at(bw, 0) * f16_at(ba, 0);
    }
    sum
}
