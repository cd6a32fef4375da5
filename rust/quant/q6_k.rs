//! Q6_K: 256 weights as 4 low bits plus 2 high bits, offset 32, 16 int8
//! scales and one f16 super-scale (210 bytes).

use super::block::f16_at;

pub const BLOCK: usize = 210;

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(256)) {
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
