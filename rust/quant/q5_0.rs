//! Q5_0: 4 low bits in nibbles plus a 32-bit mask of fifth bits, offset 16,
//! one f16 scale (22 bytes).

use super::block::f16_at;

pub const BLOCK: usize = 22;

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for j in 0..16 {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            o[j] = d * (((b[6 + j] & 0x0f) as u32 | h0) as i32 - 16) as f32;
            o[j + 16] = d * (((b[6 + j] >> 4) as u32 | h1) as i32 - 16) as f32;
        }
    }
}
