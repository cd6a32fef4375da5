//! IQ2_XS: 256 weights in 2.3125 bits (74 bytes): f16 d, 32 u16 words
//! (a 9-bit index into a 512-point grid of eight magnitudes and a 7-bit
//! sign field each), and eight bytes of two 4-bit scales, one per sixteen
//! weights, each weighing its group by `d * (2s + 1) / 8`. Pairs with Q8_K.

use super::block::f16_at;
use super::iq_common::{dot_rows, ksigns, signed, Decoded};
use super::iq_grids::IQ2XS_GRID;
use super::QK_K;

pub const BLOCK: usize = 74;

#[inline]
fn word(b: &[u8], i: usize) -> usize {
    u16::from_le_bytes([b[2 + 2 * i], b[3 + 2 * i]]) as usize
}

pub fn decode(b: &[u8], dec: &mut Decoded) {
    for ib in 0..8 {
        let sc = b[66 + ib];
        dec.scales[2 * ib] = 2 * (sc & 0x0f) as i32 + 1;
        dec.scales[2 * ib + 1] = 2 * (sc >> 4) as i32 + 1;
        for l in 0..4 {
            let w = word(b, 4 * ib + l);
            let (grid, signs) = (&IQ2XS_GRID[w & 511], ksigns(w >> 9));
            for (j, &g) in grid.iter().enumerate() {
                dec.q[32 * ib + 8 * l + j] = signed(g as i8, signs, j);
            }
        }
    }
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 0);
        for ib in 0..8 {
            let sc = b[66 + ib];
            let db = [
                d * (0.5 + (sc & 0x0f) as f32) * 0.25,
                d * (0.5 + (sc >> 4) as f32) * 0.25,
            ];
            for l in 0..4 {
                let w = word(b, 4 * ib + l);
                let (grid, signs) = (&IQ2XS_GRID[w & 511], ksigns(w >> 9));
                for j in 0..8 {
                    let v = db[l / 2] * grid[j] as f32;
                    y[32 * ib + 8 * l + j] = if signs & (1 << j) != 0 { -v } else { v };
                }
            }
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_rows(n, w, a, BLOCK, 0, 0.125, decode)
}
