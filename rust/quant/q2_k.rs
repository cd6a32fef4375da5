//! Q2_K: 256 weights in 16 groups of 16, 2-bit values with 4-bit scales and
//! mins, super-block f16 scale and min (84 bytes).

use super::block::f16_at;

pub const BLOCK: usize = 84;

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(256)) {
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
