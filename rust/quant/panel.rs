//! The activation panel of the GEMM microkernels: up to eight Q8_0 or Q8_1
//! rows interleaved so that one 32-byte load holds four consecutive
//! elements of each of the eight rows.
//!
//! Layout, per 32-element block `i`:
//! - quants: `quants[i * PANEL_BLOCK + j * 32 + c * 4 + e]` is element
//!   `4j + e` of row `c`, for groups `j < 8`;
//! - scales: `scales[i * PANEL_SCALES + c]` is row c's `d` and
//!   `scales[i * PANEL_SCALES + 8 + c]` its Q8_1 sum `s` (0 for Q8_0).
//!
//! Rows past the end of a short group are zeros, so they add nothing and
//! their outputs are simply not read.

use super::{block, q8_0, q8_1, GgmlType, GEMM_COLS};

/// Panel bytes per 32-element block.
pub const PANEL_BLOCK: usize = 32 * GEMM_COLS;
/// Panel floats per 32-element block.
pub const PANEL_SCALES: usize = 2 * GEMM_COLS;

/// Packs up to eight activation rows of `nb` blocks each (format `act`,
/// Q8_0 or Q8_1) into `quants` (`nb * PANEL_BLOCK` bytes) and `scales`
/// (`nb * PANEL_SCALES` floats). Other formats leave both untouched.
pub fn pack_panel(act: GgmlType, acts: &[&[u8]], nb: usize, quants: &mut [u8], scales: &mut [f32]) {
    let (bytes, has_s) = match act {
        GgmlType::Q8_0 => (q8_0::BLOCK, false),
        GgmlType::Q8_1 => (q8_1::BLOCK, true),
        _ => return,
    };
    let quants = &mut quants[..nb * PANEL_BLOCK];
    let scales = &mut scales[..nb * PANEL_SCALES];
    if acts.len() < GEMM_COLS {
        quants.fill(0);
    }
    scales.fill(0.0);
    for (c, a) in acts.iter().enumerate().take(GEMM_COLS) {
        for (i, b) in a.chunks_exact(bytes).take(nb).enumerate() {
            scales[i * PANEL_SCALES + c] = block::f16_at(b, 0);
            if has_s {
                scales[i * PANEL_SCALES + GEMM_COLS + c] = block::f16_at(b, 2);
            }
            let q = &b[bytes - 32..];
            let dst = &mut quants[i * PANEL_BLOCK..(i + 1) * PANEL_BLOCK];
            for (j, four) in q.chunks_exact(4).enumerate() {
                dst[j * 32 + c * 4..j * 32 + c * 4 + 4].copy_from_slice(four);
            }
        }
    }
}
