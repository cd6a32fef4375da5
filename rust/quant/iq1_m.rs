//! IQ1_M: 256 weights in 1.75 bits (56 bytes): 32 low index bytes, 16
//! bytes of high index bits and shift signs (a nibble per group of
//! eight), and 8 bytes of 3-bit scales, one per sixteen weights, whose
//! four spare nibbles hold the block's f16 scale `d`. A weight is
//! `d * (2s + 1) * (g ± 1/8)` for its grid value `g` (IQ1_S's grid), the
//! sign of the shift chosen per group of eight. Pairs with Q8_K.

use half::f16;

use super::block::f32_at;
use super::iq_common::Decoded;
use super::iq_grids::IQ1S_GRID;
use super::{q8_k, QK_K};

pub const BLOCK: usize = 56;

/// ggml's `IQ1M_DELTA`.
pub const DELTA: f32 = 0.125;

#[inline]
fn sc(b: &[u8], i: usize) -> u32 {
    u16::from_le_bytes([b[48 + 2 * i], b[49 + 2 * i]]) as u32
}

/// The block scale, spread over the top nibbles of the four scale words.
#[inline]
pub fn scale(b: &[u8]) -> f32 {
    let bits = (sc(b, 0) >> 12)
        | ((sc(b, 1) >> 8) & 0x00f0)
        | ((sc(b, 2) >> 4) & 0x0f00)
        | (sc(b, 3) & 0xf000);
    f16::from_bits(bits as u16).to_f32()
}

/// `2s + 1` of half `h` (0 or 1) of sub-block `ib`.
#[inline]
fn ls(b: &[u8], ib: usize, h: usize) -> i32 {
    2 * ((sc(b, ib / 2) >> (6 * (ib % 2) + 3 * h)) & 7) as i32 + 1
}

/// Grid row and shift sign (-1 or 1) of group `l` (0..4) of sub-block `ib`.
#[inline]
fn group(b: &[u8], ib: usize, l: usize) -> (&'static [i8; 8], i32) {
    let qh = b[32 + 2 * ib + l / 2] as usize;
    // Even groups take the low nibble of their byte, odd ones the high.
    let (shift, sign_bit) = if l.is_multiple_of(2) {
        (8, 0x08)
    } else {
        (4, 0x80)
    };
    let hi = (qh << shift) & 0x700;
    let neg = qh & sign_bit != 0;
    (
        &IQ1S_GRID[b[4 * ib + l] as usize | hi],
        if neg { -1 } else { 1 },
    )
}

pub fn decode(b: &[u8], dec: &mut Decoded) {
    for ib in 0..8 {
        dec.scales[2 * ib] = ls(b, ib, 0);
        dec.scales[2 * ib + 1] = ls(b, ib, 1);
        for l in 0..4 {
            dec.q[32 * ib + 8 * l..32 * ib + 8 * l + 8].copy_from_slice(group(b, ib, l).0);
        }
    }
}

/// `sum_groups (2s + 1) * (±1) * (sum of the group's eight activations)`.
#[inline]
pub fn shift_sum(b: &[u8], ba: &[u8]) -> i32 {
    let mut s = 0i32;
    for ib in 0..8 {
        for l in 0..4 {
            let o = 4 + 32 * ib + 8 * l;
            let a: i32 = ba[o..o + 8].iter().map(|&v| v as i8 as i32).sum();
            s += ls(b, ib, l / 2) * group(b, ib, l).1 * a;
        }
    }
    s
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK_K)) {
        let d = scale(b);
        for ib in 0..8 {
            let dl = [d * ls(b, ib, 0) as f32, d * ls(b, ib, 1) as f32];
            for l in 0..4 {
                let (grid, sign) = group(b, ib, l);
                let delta = sign as f32 * DELTA;
                for (j, &g) in grid.iter().enumerate() {
                    y[32 * ib + 8 * l + j] = dl[l / 2] * (g as f32 + delta);
                }
            }
        }
    }
}

/// One block's value from its decoded integer `isum`: `(d_w * d_a) *
/// (isum + shifts / 8)`, the form every kernel of this format keeps.
#[inline]
pub fn value(bw: &[u8], ba: &[u8], isum: i32) -> f32 {
    let d = scale(bw) * f32_at(ba, 0);
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
