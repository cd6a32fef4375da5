//! IQ3_XXS: 256 weights in 3.0625 bits (98 bytes): f16 d, 64 indices into
//! a 256-point grid of four magnitudes, then one u32 per 32-element
//! sub-block with four 7-bit sign fields (ggml's `ksigns`) and, in its top
//! four bits, the scale `s`, weighing the sub-block by `d * (2s + 1) / 4`.
//! Pairs with Q8_K.

use super::block::{f16_at, u32_at};
use super::iq_common::{dot_rows, ksigns, signed, Decoded};
use super::iq_grids::IQ3XXS_GRID;
use super::QK_K;

pub const BLOCK: usize = 98;

pub fn decode(b: &[u8], dec: &mut Decoded) {
    for ib in 0..8 {
        let w = u32_at(b, 66 + 4 * ib);
        dec.scale32(ib, 2 * (w >> 28) as i32 + 1);
        for l in 0..4 {
            let signs = ksigns(((w >> (7 * l)) & 127) as usize);
            let g1 = &IQ3XXS_GRID[b[2 + 8 * ib + 2 * l] as usize];
            let g2 = &IQ3XXS_GRID[b[3 + 8 * ib + 2 * l] as usize];
            let o = 32 * ib + 8 * l;
            for j in 0..4 {
                dec.q[o + j] = signed(g1[j] as i8, signs, j);
                dec.q[o + 4 + j] = signed(g2[j] as i8, signs, j + 4);
            }
        }
    }
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 0);
        for ib in 0..8 {
            let w = u32_at(b, 66 + 4 * ib);
            let db = d * (0.5 + (w >> 28) as f32) * 0.5;
            for l in 0..4 {
                let signs = ksigns(((w >> (7 * l)) & 127) as usize);
                let g1 = &IQ3XXS_GRID[b[2 + 8 * ib + 2 * l] as usize];
                let g2 = &IQ3XXS_GRID[b[3 + 8 * ib + 2 * l] as usize];
                let o = 32 * ib + 8 * l;
                for j in 0..4 {
                    let (v1, v2) = (db * g1[j] as f32, db * g2[j] as f32);
                    y[o + j] = if signs & (1 << j) != 0 { -v1 } else { v1 };
                    y[o + 4 + j] = if signs & (1 << (j + 4)) != 0 { -v2 } else { v2 };
                }
            }
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_rows(n, w, a, BLOCK, 0, 0.25, decode)
}
