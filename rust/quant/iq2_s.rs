//! IQ2_S: 256 weights in 2.5625 bits (82 bytes): f16 d, 32 low index
//! bytes, 32 sign bytes, eight bytes of high index bits (two per group of
//! eight), and eight bytes of two 4-bit scales, one per sixteen weights,
//! each weighing its group by `d * (2s + 1) / 8`. Indices address a
//! 1024-point grid of eight magnitudes. Pairs with Q8_K.

use super::block::f16_at;
use super::iq_common::{dot_rows, signed, Decoded};
use super::iq_grids::IQ2S_GRID;
use super::QK_K;

pub const BLOCK: usize = 82;

/// Grid index of group `l` (0..4) of sub-block `ib`.
#[inline]
fn index(b: &[u8], ib: usize, l: usize) -> usize {
    let qh = b[66 + ib] as usize;
    b[2 + 4 * ib + l] as usize | ((qh << (8 - 2 * l)) & 0x300)
}

pub fn decode(b: &[u8], dec: &mut Decoded) {
    for ib in 0..8 {
        let sc = b[74 + ib];
        dec.scales[2 * ib] = 2 * (sc & 0x0f) as i32 + 1;
        dec.scales[2 * ib + 1] = 2 * (sc >> 4) as i32 + 1;
        for l in 0..4 {
            let (grid, signs) = (&IQ2S_GRID[index(b, ib, l)], b[34 + 4 * ib + l]);
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
            let sc = b[74 + ib];
            let db = [
                d * (0.5 + (sc & 0x0f) as f32) * 0.25,
                d * (0.5 + (sc >> 4) as f32) * 0.25,
            ];
            for l in 0..4 {
                let (grid, signs) = (&IQ2S_GRID[index(b, ib, l)], b[34 + 4 * ib + l]);
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
