//! Q4_0: 32 weights as 4-bit values offset by 8, one f16 scale (18 bytes).

use super::block::f16_at;

pub const BLOCK: usize = 18;

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        for j in 0..16 {
            o[j] = d * ((b[2 + j] & 0x0f) as i32 - 8) as f32;
            o[j + 16] = d * ((b[2 + j] >> 4) as i32 - 8) as f32;
        }
    }
}
