//! The GEMM microkernel for the 32-element block formats: weight rows, two at
//! a time, against a panel of eight activation columns.
//!
//! Why this shape: the eight columns live in the eight lanes of one
//! accumulator. The panel (`quant::panel`) stores each block as eight groups
//! of 32 bytes, group `j` holding elements `4j..4j + 4` of every column, so
//! one `maddubs` of that group against four weight bytes broadcast to all
//! lanes advances all eight columns at once, and its i16 pair sums sit two
//! per column. Up to `FOLD` groups add as i16, one `madd` by ones widens to
//! the eight exact per-column block sums, then a single conversion and FMA
//! scale all eight. Per block and row that is eight multiplies and one
//! widening where a dot-product layout needs eight of each plus eight
//! conversions, FMAs and a horizontal sum per column; integer multiplies
//! are the one port this CPU family has least of.
//!
//! The per-(row, column) arithmetic is that of every other `Block32`
//! kernel (see `avx2/mod.rs`), so results are bit-identical to a single
//! row's decode.

use std::arch::x86_64::*;

use super::{load, read_u32, widen, Block32};
use crate::quant::panel::{PANEL_BLOCK, PANEL_SCALES};
use crate::quant::GEMM_COLS;

const C: usize = GEMM_COLS;

/// Row tile: two rows share each panel load (four measured no faster here).
const R: usize = 2;

/// Weight rows `w` (R of them, decoded once into `dec`: 32 bytes per block
/// in element order) against `groups` panels back to back; writes
/// `out[g * out_stride + r * 8 + c]`.
///
/// # Safety
/// AVX2, FMA and F16C are available; every row holds `nb` weight blocks,
/// `dec` `R * nb * 32` bytes, `panels` `groups * nb * PANEL_BLOCK` bytes,
/// `scales` `groups * nb * PANEL_SCALES` floats and `out` `R * 8` floats
/// from each `g * out_stride`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows<F: Block32, const N: usize>(
    nb: usize,
    w: [*const u8; N],
    dec: *mut u8,
    (panels, scales, groups): (*const u8, *const f32, usize),
    out: *mut f32,
    out_stride: usize,
) {
    // Decode once; the block loop then broadcasts four bytes at a time
    // from this L1-resident copy (loads, not shuffles).
    for (r, w) in w.iter().enumerate() {
        for i in 0..nb {
            // SAFETY: block i of row r is in bounds, and so is its 32-byte
            // slot in `dec` (caller's contract).
            unsafe {
                _mm256_storeu_si256(
                    dec.add((r * nb + i) * 32) as *mut __m256i,
                    F::quants(w.add(i * F::W)),
                )
            };
        }
    }
    for g in 0..groups {
        let panel = panels.wrapping_add(g * nb * PANEL_BLOCK);
        let scales = scales.wrapping_add(g * nb * PANEL_SCALES);
        let out = out.wrapping_add(g * out_stride);
        // SAFETY: panel, scales and out of group g (caller's contract).
        unsafe { compute::<F, N>(nb, w, dec, panel, scales, out) };
    }
}

/// The decoded rows in `dec` against one panel; writes `out[r * 8 + c]`.
///
/// # Safety
/// As `rows`, for one panel.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn compute<F: Block32, const N: usize>(
    nb: usize,
    w: [*const u8; N],
    dec: *const u8,
    panel: *const u8,
    scales: *const f32,
    out: *mut f32,
) {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut mins = [_mm256_setzero_ps(); N];
    for i in 0..nb {
        let mut isum = [_mm256_setzero_si256(); N];
        let mut part = [_mm256_setzero_si256(); N];
        for j in 0..8 {
            // SAFETY: group j of block i is inside the panel.
            let a = unsafe { load(panel.add(i * PANEL_BLOCK + j * 32)) };
            for r in 0..N {
                // SAFETY: bytes 4j..4j + 4 of row r's decoded block i.
                let wj = unsafe { read_u32(dec.add((r * nb + i) * 32 + 4 * j)) };
                let p = super::products::<F>(_mm256_set1_epi32(wj as i32), a);
                if F::FOLD == 1 {
                    isum[r] = _mm256_add_epi32(isum[r], widen(p));
                } else {
                    part[r] = _mm256_add_epi16(part[r], p);
                    if (j + 1) % F::FOLD == 0 {
                        isum[r] = _mm256_add_epi32(isum[r], widen(part[r]));
                        part[r] = _mm256_setzero_si256();
                    }
                }
            }
        }
        // SAFETY: block i's eight scales and eight sums are in `scales`.
        let (da, sa) = unsafe {
            (
                _mm256_loadu_ps(scales.add(i * PANEL_SCALES)),
                _mm256_loadu_ps(scales.add(i * PANEL_SCALES + C)),
            )
        };
        for r in 0..N {
            // SAFETY: block i of row r is in bounds.
            let dm = unsafe { F::scales(w[r].add(i * F::W)) };
            let prod = _mm256_mul_ps(_mm256_broadcastss_ps(dm), da);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), prod, acc[r]);
            if F::MIN {
                let m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
                mins[r] = _mm256_add_ps(mins[r], _mm256_mul_ps(m, sa));
            }
        }
    }
    for r in 0..N {
        let v = if F::MIN {
            _mm256_add_ps(acc[r], mins[r])
        } else {
            acc[r]
        };
        // SAFETY: out holds 8 floats per row.
        unsafe { _mm256_storeu_ps(out.add(r * C), v) };
    }
}

/// The lengths every 32-element GEMM entry reads (rows of `nb` blocks,
/// `groups` panels and their scales, 8 outputs per row and group); the
/// kernels' safety rests on this one check.
pub(super) fn check_operands<F: Block32>(
    nb: usize,
    w_rows: &[&[u8]],
    panel: &[u8],
    scales: &[f32],
    groups: usize,
    out: &[f32],
) {
    assert!(
        w_rows.iter().all(|w| w.len() >= nb * F::W)
            && panel.len() >= groups * nb * PANEL_BLOCK
            && scales.len() >= groups * nb * PANEL_SCALES
            && out.len() >= groups * w_rows.len() * C,
        "gemm operand too short"
    );
}

/// Safe entry: `groups` panels back to back in `panel` and `scales`,
/// `out[(g * rows + r) * 8 + c]`; checks every length the kernel reads,
/// then runs it, decoding each row once for all the panels.
pub(super) fn gemm<F: Block32>(
    n: usize,
    w_rows: &[&[u8]],
    panel: &[u8],
    scales: &[f32],
    groups: usize,
    out: &mut [f32],
) {
    let nb = n / 32;
    let n_rows = w_rows.len();
    check_operands::<F>(nb, w_rows, panel, scales, groups, out);
    let mut dec = vec![0u8; R * nb * 32];
    let ps = (panel.as_ptr(), scales.as_ptr(), groups);
    let d = dec.as_mut_ptr();
    let stride = n_rows * C;
    let mut r = 0;
    // SAFETY (both calls): the table holding this function is installed
    // only after AVX2, FMA and F16C were detected; `check_operands` bounds every
    // read of the rows, panels and scales, `dec` holds R rows, and `out`
    // 8 floats for each row of each group.
    while r + R <= n_rows {
        let w = std::array::from_fn(|k| w_rows[r + k].as_ptr());
        unsafe { rows::<F, R>(nb, w, d, ps, out[r * C..].as_mut_ptr(), stride) };
        r += R;
    }
    if r < n_rows {
        let w = [w_rows[r].as_ptr()];
        unsafe { rows::<F, 1>(nb, w, d, ps, out[r * C..].as_mut_ptr(), stride) };
    }
}
