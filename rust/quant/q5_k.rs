//! Q5_K: Q4_K plus a fifth bit per weight in a 32-byte mask (176 bytes):
//! d, dmin, scales[12], qh[32], qs[128]. Element `64g + 32j + l` takes bit
//! `2g + j` of `qh[l]`. Dot products pair it with Q8_K.

use super::block::f16_at;
use super::kquant_scales::scale_min_k4;
use super::{q4_k, q8_k, QK_K};

pub const BLOCK: usize = 176;

/// The 256 unsigned 5-bit values of one block, in element order.
#[inline]
pub fn values(b: &[u8]) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        let (g, hi, l) = (e / 64, (e / 32) % 2, e % 32);
        let low = (b[48 + 32 * g + l] >> (4 * hi)) & 0x0f;
        let high = (b[16 + l] >> (2 * g + hi)) & 1;
        *v = (low | (high << 4)) as i8;
    }
    q
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
        for g in 0..4 {
            let (s1, m1) = scale_min_k4(2 * g, scales);
            let (s2, m2) = scale_min_k4(2 * g + 1, scales);
            let (d1, mn1, d2, mn2) = (
                d * s1 as f32,
                dmin * m1 as f32,
                d * s2 as f32,
                dmin * m2 as f32,
            );
            let (u1, u2) = (1u8 << (2 * g), 2u8 << (2 * g));
            let ql = &qs[g * 32..g * 32 + 32];
            for l in 0..32 {
                let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                y[g * 64 + l] = d1 * ((ql[l] & 0x0f) + h1) as f32 - mn1;
                y[g * 64 + 32 + l] = d2 * ((ql[l] >> 4) + h2) as f32 - mn2;
            }
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    w.chunks_exact(BLOCK)
        .zip(a.chunks_exact(q8_k::BLOCK))
        .take(n / QK_K)
        .map(|(bw, ba)| q4_k::dot_block(&values(bw), bw, ba))
        .sum()
}
