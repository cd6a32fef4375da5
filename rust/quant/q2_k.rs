//! Q2_K: 256 weights in 16 groups of 16, 2-bit values with 4-bit scales and
//! mins, super-block f16 scale and min (84 bytes): scales[16], qs[64], d, dmin.
//!
//! Element `e` is bits `2k..2k+2` of `qs[32h + l]` where `e = 128h + 32k + l`;
//! its group is `e / 16`. Dot products pair it with Q8_K activations.

use super::block::{dot_groups16, f16_at, f32_at, q8k_bsums};
use super::{q8_k, QK_K};

pub const BLOCK: usize = 84;

/// The 256 unsigned 2-bit values of one block, in element order.
#[inline]
pub fn values(b: &[u8]) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        let (h, k, l) = (e / 128, (e / 32) % 4, e % 32);
        *v = ((b[16 + 32 * h + l] >> (2 * k)) & 3) as i8;
    }
    q
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK_K)) {
        let (scales, qs) = (&b[0..16], &b[16..80]);
        let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
        let mut out = 0;
        let mut is = 0;
        for half in 0..2 {
            let q = &qs[half * 32..half * 32 + 32];
            for shift in [0u32, 2, 4, 6] {
                for part in 0..2 {
                    let sc = scales[is];
                    is += 1;
                    let (dl, ml) = (d * (sc & 0x0f) as f32, dmin * (sc >> 4) as f32);
                    for l in 0..16 {
                        y[out] = dl * ((q[part * 16 + l] >> shift) & 3) as f32 - ml;
                        out += 1;
                    }
                }
            }
        }
    }
}

/// `d_a * (d * sum_g sc_g dot_g - dmin * sum_g m_g bsum_g)`, as ggml.
pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w
        .chunks_exact(BLOCK)
        .zip(a.chunks_exact(q8_k::BLOCK))
        .take(n / QK_K)
    {
        let scales: [i32; 16] = std::array::from_fn(|g| (bw[g] & 0x0f) as i32);
        let bsums = q8k_bsums(ba);
        let summs: i32 = (0..16).map(|g| bsums[g] * (bw[g] >> 4) as i32).sum();
        let isum = dot_groups16(&values(bw), &ba[4..260], &scales);
        let da = f32_at(ba, 0);
        let (dall, dmin) = (da * f16_at(bw, 80), da * f16_at(bw, 82));
        sum += dall * isum as f32 - dmin * summs as f32;
    }
    sum
}
