//! Q6_K: 256 weights as 4 low bits plus 2 high bits, offset 32, 16 int8
//! scales and one f16 super-scale (210 bytes): ql[128], qh[64], scales[16], d.
//!
//! Element `e = 128h + 32k + l` takes nibble `k / 2` (low, then high) of
//! `ql[64h + 32(k % 2) + l]` and bits `2k..2k+2` of `qh[32h + l]`; its group
//! is `e / 16`. Dot products pair it with Q8_K.

use super::block::{dot_groups16, f16_at, f32_at};
use super::{q8_k, QK_K};

pub const BLOCK: usize = 210;

/// The 256 signed 6-bit values (-32..=31) of one block, in element order.
#[inline]
pub fn values(b: &[u8]) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        let (h, k, l) = (e / 128, (e / 32) % 4, e % 32);
        let low = (b[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0f;
        let high = (b[128 + 32 * h + l] >> (2 * k)) & 3;
        *v = (low | (high << 4)) as i8 - 32;
    }
    q
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK_K)) {
        let (ql_all, qh_all, sc_all) = (&b[0..128], &b[128..192], &b[192..208]);
        let d = f16_at(b, 208);
        for h in 0..2 {
            let (ql, qh, sc) = (&ql_all[h * 64..], &qh_all[h * 32..], &sc_all[h * 8..]);
            let y = &mut y[h * 128..];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
            }
        }
    }
}

/// `(d * d_a) * sum_g sc_g * dot_g`, integer inside a super-block, the
/// super-blocks added in order from +0.0 (the order of every SIMD kernel of
/// this format, so that all give these bits).
pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w
        .chunks_exact(BLOCK)
        .zip(a.chunks_exact(q8_k::BLOCK))
        .take(n / QK_K)
    {
        let scales: [i32; 16] = std::array::from_fn(|g| bw[192 + g] as i8 as i32);
        let isum = dot_groups16(&values(bw), &ba[4..260], &scales);
        sum += (f16_at(bw, 208) * f32_at(ba, 0)) * isum as f32;
    }
    sum
}
