//! IQ4_NL: 32 weights as 4-bit indices into a non-linear codebook
//! (`KVALUES_IQ4NL`), one f16 scale (18 bytes). Byte j holds element j in
//! its low nibble and j+16 in its high one. Pairs with Q8_0.

use super::block::f16_at;
use super::iq_common::KVALUES_IQ4NL;
use super::q8_0;

pub const QK: usize = 32;
pub const BLOCK: usize = 18;

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for j in 0..16 {
            o[j] = d * KVALUES_IQ4NL[(b[2 + j] & 0x0f) as usize] as f32;
            o[j + 16] = d * KVALUES_IQ4NL[(b[2 + j] >> 4) as usize] as f32;
        }
    }
}

/// The integer dot of one block's 32 codebook values with a Q8_0 block's.
#[inline]
pub fn block_isum(qs: &[u8], q8: &[u8], table: &[i8; 16]) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        s += table[(qs[j] & 0x0f) as usize] as i32 * (q8[j] as i8 as i32);
        s += table[(qs[j] >> 4) as usize] as i32 * (q8[j + 16] as i8 as i32);
    }
    s
}

/// `sum_blocks (d_w * d_a) * isum`, in block order.
pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w
        .chunks_exact(BLOCK)
        .zip(a.chunks_exact(q8_0::BLOCK))
        .take(n / QK)
    {
        let s = block_isum(&bw[2..], &ba[2..], &KVALUES_IQ4NL);
        sum += f16_at(bw, 0) * f16_at(ba, 0) * s as f32;
    }
    sum
}
