//! Q5_1: like Q5_0 with an f16 minimum instead of an offset (24 bytes).

use super::block::f16_at;

pub const BLOCK: usize = 24;

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(32)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for j in 0..16 {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            o[j] = d * ((b[8 + j] & 0x0f) as u32 | h0) as f32 + m;
            o[j + 16] = d * ((b[8 + j] >> 4) as u32 | h1) as f32 + m;
        }
    }
}
