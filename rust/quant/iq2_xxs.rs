//! IQ2_XXS: 256 weights in 2.0625 bits (66 bytes): f16 d, then for each
//! 32-element sub-block two u32 words. The first holds four indices into
//! a 256-point grid of eight magnitudes; the second holds four 7-bit sign
//! fields (ggml's `ksigns`) and, in its top four bits, the sub-block scale
//! `s`, weighing the sub-block by `d * (2s + 1) / 8`. Pairs with Q8_K.

use super::block::{f16_at, u32_at};
use super::iq_common::{dot_rows, ksigns, signed, Decoded};
use super::iq_grids::IQ2XXS_GRID;
use super::QK_K;

pub const BLOCK: usize = 66;

pub fn decode(b: &[u8], dec: &mut Decoded) {
    for ib in 0..8 {
        let (w0, w1) = (u32_at(b, 2 + 8 * ib), u32_at(b, 6 + 8 * ib));
        dec.scale32(ib, 2 * (w1 >> 28) as i32 + 1);
        for l in 0..4 {
            let grid = &IQ2XXS_GRID[((w0 >> (8 * l)) & 0xff) as usize];
            let signs = ksigns(((w1 >> (7 * l)) & 127) as usize);
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
            let (w0, w1) = (u32_at(b, 2 + 8 * ib), u32_at(b, 6 + 8 * ib));
            let db = d * (0.5 + (w1 >> 28) as f32) * 0.25;
            for l in 0..4 {
                let grid = &IQ2XXS_GRID[((w0 >> (8 * l)) & 0xff) as usize];
                let signs = ksigns(((w1 >> (7 * l)) & 127) as usize);
                for j in 0..8 {
                    let v = db * grid[j] as f32;
                    y[32 * ib + 8 * l + j] = if signs & (1 << j) != 0 { -v } else { v };
                }
            }
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_rows(n, w, a, BLOCK, 0, 0.125, decode)
}
