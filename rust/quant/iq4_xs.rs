//! IQ4_XS: 256 weights in 4.25 bits (136 bytes): f16 d, a u16 of the
//! sub-block scales' high bits, four bytes of their low nibbles, and 128
//! bytes of 4-bit codebook indices (`KVALUES_IQ4NL`; per 32-element
//! sub-block, byte j holds element j low and j+16 high). Sub-block `ib`
//! weighs `d * (ls - 32)` for its 6-bit `ls`. Pairs with Q8_K.

use super::block::f16_at;
use super::iq_common::{dot_rows, Decoded, KVALUES_IQ4NL};
use super::QK_K;

pub const BLOCK: usize = 136;

/// The 6-bit scale of sub-block `ib`, less 32.
#[inline]
pub fn scale(b: &[u8], ib: usize) -> i32 {
    let h = u16::from_le_bytes([b[2], b[3]]) as i32;
    let lo = (b[4 + ib / 2] as i32 >> (4 * (ib % 2))) & 0x0f;
    (lo | (((h >> (2 * ib)) & 3) << 4)) - 32
}

pub fn decode(b: &[u8], dec: &mut Decoded) {
    for ib in 0..8 {
        dec.scale32(ib, scale(b, ib));
        let qs = &b[8 + 16 * ib..24 + 16 * ib];
        for j in 0..16 {
            dec.q[32 * ib + j] = KVALUES_IQ4NL[(qs[j] & 0x0f) as usize];
            dec.q[32 * ib + 16 + j] = KVALUES_IQ4NL[(qs[j] >> 4) as usize];
        }
    }
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 0);
        for ib in 0..8 {
            let dl = d * scale(b, ib) as f32;
            let qs = &b[8 + 16 * ib..24 + 16 * ib];
            for j in 0..16 {
                y[32 * ib + j] = dl * KVALUES_IQ4NL[(qs[j] & 0x0f) as usize] as f32;
                y[32 * ib + 16 + j] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
            }
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_rows(n, w, a, BLOCK, 0, 1.0, decode)
}
