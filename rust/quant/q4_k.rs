//! Q4_K: 256 weights in 8 groups of 32, 4-bit values, 6-bit scales and mins,
//! f16 super-block scale and min (144 bytes).

use super::block::f16_at;
use super::kquant_scales::scale_min_k4;

pub const BLOCK: usize = 144;

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(256)) {
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
