//! Q4_K: 256 weights in 8 groups of 32, 4-bit values, 6-bit scales and mins,
//! f16 super-block scale and min (144 bytes): d, dmin, scales[12], qs[128].
//!
//! Element `64g + l` is the low nibble of `qs[32g + l]`, `64g + 32 + l` its
//! high nibble; sub-block `e / 32`. Dot products pair it with Q8_K.

use super::block::{dot_groups16, f16_at, f32_at, q8k_bsums};
use super::kquant_scales::{scale_min_k4, scales_mins};
use super::{q8_k, QK_K};

pub const BLOCK: usize = 144;

/// The 256 unsigned 4-bit values of one block, in element order.
#[inline]
pub fn values(b: &[u8]) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        let (g, hi, l) = (e / 64, (e / 32) % 2, e % 32);
        *v = ((b[16 + 32 * g + l] >> (4 * hi)) & 0x0f) as i8;
    }
    q
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let (scales, qs) = (&b[4..16], &b[16..144]);
        for g in 0..4 {
            let (s1, m1) = scale_min_k4(2 * g, scales);
            let (s2, m2) = scale_min_k4(2 * g + 1, scales);
            let (d1, mn1, d2, mn2) = (
                d * s1 as f32,
                dmin * m1 as f32,
                d * s2 as f32,
                dmin * m2 as f32,
            );
            let q = &qs[g * 32..g * 32 + 32];
            for l in 0..32 {
                y[g * 64 + l] = d1 * (q[l] & 0x0f) as f32 - mn1;
                y[g * 64 + 32 + l] = d2 * (q[l] >> 4) as f32 - mn2;
            }
        }
    }
}

/// Shared by Q4_K and Q5_K: `d d_a sum_g sc_g dot_g - dmin d_a sum_g m_g bsum_g`.
#[inline]
pub fn dot_block(q: &[i8; QK_K], bw: &[u8], ba: &[u8]) -> f32 {
    let (sc, mn) = scales_mins(&bw[4..16]);
    let byte = |v: u64, j: usize| ((v >> (8 * j)) & 0xff) as i32;
    let scales: [i32; 16] = std::array::from_fn(|g| byte(sc, g / 2));
    let bsums = q8k_bsums(ba);
    let summ: i32 = (0..16).map(|g| bsums[g] * byte(mn, g / 2)).sum();
    let isum = dot_groups16(q, &ba[4..260], &scales);
    let da = f32_at(ba, 0);
    (f16_at(bw, 0) * da) * isum as f32 - (f16_at(bw, 2) * da) * summ as f32
}

/// The super-blocks' values added in order from +0.0: the order every
/// SIMD kernel of this format keeps, so that all give these bits.
pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w
        .chunks_exact(BLOCK)
        .zip(a.chunks_exact(q8_k::BLOCK))
        .take(n / QK_K)
    {
        sum += dot_block(&values(bw), bw, ba);
    }
    sum
}
