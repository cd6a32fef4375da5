//! IQ3_S: 256 weights in 3.4375 bits (110 bytes): f16 d, 64 low index
//! bytes, 8 bytes of ninth index bits, 32 sign bytes, and four bytes of
//! two 4-bit scales, one per 32-element sub-block, each weighing it by
//! `d * (2s + 1)`. Indices address a 512-point grid of four magnitudes.
//! Pairs with Q8_K.

use super::block::f16_at;
use super::iq_common::{dot_rows, signed, Decoded};
use super::iq_grids::IQ3S_GRID;
use super::QK_K;

pub const BLOCK: usize = 110;

/// The two grid rows of group `l` (0..4) of sub-block `ib`.
#[inline]
fn rows(b: &[u8], ib: usize, l: usize) -> (&'static [u8; 4], &'static [u8; 4]) {
    let qh = b[66 + ib] as usize;
    let (lo1, lo2) = (
        b[2 + 8 * ib + 2 * l] as usize,
        b[3 + 8 * ib + 2 * l] as usize,
    );
    (
        &IQ3S_GRID[lo1 | ((qh << (8 - 2 * l)) & 256)],
        &IQ3S_GRID[lo2 | ((qh << (7 - 2 * l)) & 256)],
    )
}

#[inline]
fn scale(b: &[u8], ib: usize) -> u8 {
    (b[106 + ib / 2] >> (4 * (ib % 2))) & 0x0f
}

pub fn decode(b: &[u8], dec: &mut Decoded) {
    for ib in 0..8 {
        dec.scale32(ib, 2 * scale(b, ib) as i32 + 1);
        for l in 0..4 {
            let (g1, g2) = rows(b, ib, l);
            let signs = b[74 + 4 * ib + l];
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
            let db = d * (1 + 2 * scale(b, ib) as i32) as f32;
            for l in 0..4 {
                let (g1, g2) = rows(b, ib, l);
                let signs = b[74 + 4 * ib + l];
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
    dot_rows(n, w, a, BLOCK, 0, 1.0, decode)
}
