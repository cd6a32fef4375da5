//! IQ1_S: 256 weights in 1.5625 bits (50 bytes): f16 d, 32 low index
//! bytes, and one u16 per 32-element sub-block holding the indices' three
//! high bits per group of eight, a 3-bit scale `s` and the sign of a
//! shift. A weight is `d * (2s + 1) * (g ± 1/8)` for its grid value `g` in
//! {-1, 0, 1} of a 2048-point grid. Pairs with Q8_K.

use super::block::{f16_at, f32_at, q8k_bsums};
use super::iq_common::Decoded;
use super::iq_grids::IQ1S_GRID;
use super::{q8_k, QK_K};

pub const BLOCK: usize = 50;

/// ggml's `IQ1S_DELTA`.
pub const DELTA: f32 = 0.125;

#[inline]
fn qh(b: &[u8], ib: usize) -> u32 {
    u16::from_le_bytes([b[34 + 2 * ib], b[35 + 2 * ib]]) as u32
}

#[inline]
fn grid(b: &[u8], ib: usize, l: usize) -> &'static [i8; 8] {
    &IQ1S_GRID[b[2 + 4 * ib + l] as usize | ((((qh(b, ib) >> (3 * l)) & 7) as usize) << 8)]
}

/// The grid values with each sub-block's `2s + 1`; the shifts are apart.
pub fn decode(b: &[u8], dec: &mut Decoded) {
    for ib in 0..8 {
        dec.scale32(ib, 2 * ((qh(b, ib) >> 12) & 7) as i32 + 1);
        for l in 0..4 {
            dec.q[32 * ib + 8 * l..32 * ib + 8 * l + 8].copy_from_slice(grid(b, ib, l));
        }
    }
}

/// `sum_ib (2s + 1) * (±1) * (sum of the sub-block's activations)`: the
/// shifts' integer part of the dot, from the Q8_K group sums.
#[inline]
pub fn shift_sum(b: &[u8], ba: &[u8]) -> i32 {
    let bsums = q8k_bsums(ba);
    let mut s = 0i32;
    for ib in 0..8 {
        let h = qh(b, ib);
        let ls = 2 * ((h >> 12) & 7) as i32 + 1;
        let sign = if h & 0x8000 != 0 { -1 } else { 1 };
        s += ls * sign * (bsums[2 * ib] + bsums[2 * ib + 1]);
    }
    s
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 0);
        for ib in 0..8 {
            let h = qh(b, ib);
            let dl = d * (2 * ((h >> 12) & 7) + 1) as f32;
            let delta = if h & 0x8000 != 0 { -DELTA } else { DELTA };
            for l in 0..4 {
                for (j, &g) in grid(b, ib, l).iter().enumerate() {
                    y[32 * ib + 8 * l + j] = dl * (g as f32 + delta);
                }
            }
        }
    }
}

/// One block's value from its decoded integer `isum`: `(d_w * d_a) *
/// (isum + shifts / 8)`, the form every kernel of this format keeps.
#[inline]
pub fn value(bw: &[u8], ba: &[u8], isum: i32) -> f32 {
    let d = f16_at(bw, 0) * f32_at(ba, 0);
    d * (isum as f32 + DELTA * shift_sum(bw, ba) as f32)
}

/// The blocks' values added in order from +0.0.
pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    let mut dec = Decoded::new();
    for (bw, ba) in w
        .chunks_exact(BLOCK)
        .zip(a.chunks_exact(q8_k::BLOCK))
        .take(n / QK_K)
    {
        decode(bw, &mut dec);
        sum += value(bw, ba, dec.isum(ba));
    }
    sum
}
