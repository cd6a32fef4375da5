//! Q5_K: Q4_K plus a fifth bit per weight in a 32-byte mask (176 bytes).

use super::block::f16_at;
use super::kquant_scales::scale_min_k4;

pub const BLOCK: usize = 176;

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(256)) {
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
