//! The GEMM microkernel of the 32-element formats on CPUs with AVX-512 VNNI:
//! the twin of `gemm.rs`, chosen at run time, with the same bits.
//!
//! Why it is faster: `vpdpbusd` multiplies unsigned by signed bytes and
//! adds each four products into an i32 lane in one instruction, where
//! AVX2 needs `maddubs`, an i16 add and a widening `madd`; and one 512-bit
//! instruction serves two weight rows. Lanes `2c` and `2c + 1` hold
//! column `c` of a row pair: the panel's group (four elements of each of
//! the eight columns) is spread so that each column's four bytes fill two
//! lanes, and the pair's decoded weights are stored interleaved (four
//! bytes of the first row, four of the second), so that one 8-byte
//! broadcast puts the first row in the even lanes and the second in the
//! odd ones.
//!
//! `vpdpbusd` needs unsigned weights. The signed formats are multiplied
//! in their unsigned storage form (Q4_0 and Q5_0 before their -8 / -16,
//! Q8_0 plus 128) and the offset times the column's block sum (the Q8_0
//! panel carries it) is subtracted once per block, for all rows at once.
//! Every block sum is thus the exact integer AVX2 forms; the float tail
//! per (row, column) is `gemm.rs`'s, operation for operation, so a token's
//! result does not depend on the CPU's VNNI support either.

use std::arch::x86_64::*;

use super::{load, read_u32, Block32};
use crate::quant::panel::{PANEL_BLOCK, PANEL_SCALES};
use crate::quant::GEMM_COLS;

const C: usize = GEMM_COLS;

/// Row pairs sharing each spread panel group (four rows: the widest that
/// keeps sums, accumulators and the spread groups in registers).
const P: usize = 2;

/// Decoded bytes per (row pair, block): the two rows' 32 values,
/// interleaved four bytes at a time.
const PAIR_BLOCK: usize = 64;

/// Decoded bytes per (row pair, block) in all: the values and the f32
/// scale quad `[d_0, d_1, m_0, m_1]`.
const PAIR_BYTES: usize = PAIR_BLOCK + 16;

/// Whether this CPU runs the kernel (checked once by the caller's table).
pub(super) fn available() -> bool {
    super::available()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// Lane `2c` and `2c + 1` take lane `c`: a column's value for both rows.
#[inline]
#[target_feature(enable = "avx512f")]
fn spread_index() -> __m512i {
    _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0)
}

/// Even lanes first, then odd ones: a pair's result as two rows of eight.
#[inline]
#[target_feature(enable = "avx512f")]
fn split_index() -> __m512i {
    _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0)
}

/// The 64-bit pattern `[lo, hi]` of `v` in every 64-bit lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn pairs_of(v: __m128) -> __m512 {
    _mm512_castpd_ps(_mm512_broadcastsd_pd(_mm_castps_pd(v)))
}

/// Decodes `P2` row pairs `w` (rows `2p`, `2p + 1`) into `dec`: per pair,
/// `nb` interleaved blocks of values, then `nb` scale quads
/// `[d_0, d_1, m_0, m_1]` as f32.
///
/// # Safety
/// As `compute`; every row holds `nb` weight blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn decode<F: Block32, const P2: usize>(nb: usize, w: [[*const u8; 2]; P2], dec: *mut u8) {
    for (p, rows) in w.iter().enumerate() {
        let base = dec.wrapping_add(p * nb * PAIR_BYTES);
        for i in 0..nb {
            // SAFETY: block i of both rows is in bounds, and so are its
            // slots in `dec` (caller's contract).
            unsafe {
                let (b0, b1) = (rows[0].add(i * F::W), rows[1].add(i * F::W));
                let (lo, hi) = (F::uquants(b0), F::uquants(b1));
                let (a, b) = (_mm256_unpacklo_epi32(lo, hi), _mm256_unpackhi_epi32(lo, hi));
                let d = base.add(i * PAIR_BLOCK);
                _mm256_storeu_si256(d as *mut __m256i, _mm256_permute2x128_si256::<0x20>(a, b));
                _mm256_storeu_si256(
                    d.add(32) as *mut __m256i,
                    _mm256_permute2x128_si256::<0x31>(a, b),
                );
                let dm = _mm_unpacklo_ps(F::scales(b0), F::scales(b1));
                _mm_storeu_ps(base.add(nb * PAIR_BLOCK + i * 16) as *mut f32, dm);
            }
        }
    }
}

/// The decoded pairs in `dec` against one panel; writes `out[r * 8 + c]`
/// for the `2 * P2` rows. `ahead`, when not null, is prefetched a slice
/// per block (the rows the next decode reads).
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 F/VL and VNNI are available; `dec` holds `P2`
/// decoded pairs of `nb` blocks, `panel` `nb * PANEL_BLOCK` bytes, `scales`
/// `nb * PANEL_SCALES` floats and `out` `2 * P2 * 8` floats.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn compute<F: Block32, const P2: usize>(
    nb: usize,
    dec: *const u8,
    panel: *const u8,
    scales: *const f32,
    out: *mut f32,
    ahead: *const u8,
) {
    let step = 2 * P2 * F::W;
    let spread = spread_index();
    let offset = _mm512_set1_epi32(F::OFFSET);
    let mut acc = [_mm512_setzero_ps(); P2];
    let mut mins = [_mm512_setzero_ps(); P2];
    for i in 0..nb {
        if !ahead.is_null() {
            crate::simd::prefetch_bytes(ahead.wrapping_add(i * step), step + 64);
        }
        // Two partial sums per pair, over even and odd groups, so that
        // the `vpdpbusd` chains interleave (integer sums: exact either way).
        let mut part = [[_mm512_setzero_si512(); 2]; P2];
        for j in 0..8 {
            // SAFETY: group j of block i is inside the panel.
            let group = unsafe { load(panel.add(i * PANEL_BLOCK + j * 32)) };
            let a = _mm512_permutexvar_epi32(spread, _mm512_castsi256_si512(group));
            for (p, s) in part.iter_mut().enumerate() {
                // SAFETY: group j of pair p's decoded block i.
                let q = unsafe {
                    let d = dec.add(p * nb * PAIR_BYTES + i * PAIR_BLOCK + 8 * j);
                    (read_u32(d) as u64) | ((read_u32(d.add(4)) as u64) << 32)
                };
                s[j % 2] = _mm512_dpbusd_epi32(s[j % 2], _mm512_set1_epi64(q as i64), a);
            }
        }
        let mut isum: [__m512i; P2] =
            std::array::from_fn(|p| _mm512_add_epi32(part[p][0], part[p][1]));
        // SAFETY: block i's eight scales and eight sums are in `scales`.
        let (da, sa) = unsafe {
            (
                _mm512_permutexvar_ps(
                    spread,
                    _mm512_castps256_ps512(_mm256_loadu_ps(scales.add(i * PANEL_SCALES))),
                ),
                _mm512_permutexvar_ps(
                    spread,
                    _mm512_castps256_ps512(_mm256_loadu_ps(scales.add(i * PANEL_SCALES + C))),
                ),
            )
        };
        if F::OFFSET != 0 {
            // The Q8_0 panel's sums are small integers, exact as f32.
            let corr = _mm512_mullo_epi32(_mm512_cvtps_epi32(sa), offset);
            for s in isum.iter_mut() {
                *s = _mm512_sub_epi32(*s, corr);
            }
        }
        for p in 0..P2 {
            // [d_0, d_1, m_0, m_1]: the scales in the lanes of their rows.
            // SAFETY: pair p's scale quad of block i is in `dec`.
            let dm = unsafe {
                _mm_loadu_ps(dec.add(p * nb * PAIR_BYTES + nb * PAIR_BLOCK + i * 16) as *const f32)
            };
            let prod = _mm512_mul_ps(pairs_of(dm), da);
            acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[p]), prod, acc[p]);
            if F::MIN {
                let m = pairs_of(_mm_movehl_ps(dm, dm));
                mins[p] = _mm512_add_ps(mins[p], _mm512_mul_ps(m, sa));
            }
        }
    }
    let split = split_index();
    for p in 0..P2 {
        let v = if F::MIN {
            _mm512_add_ps(acc[p], mins[p])
        } else {
            acc[p]
        };
        // SAFETY: out holds 8 floats for each of the 2 * P2 rows.
        unsafe { _mm512_storeu_ps(out.add(2 * p * C), _mm512_permutexvar_ps(split, v)) };
    }
}

/// Safe entry, as `gemm::gemm`: `groups` panels back to back in `panel`
/// and `scales`, `out[(g * rows + r) * 8 + c]`. Each row pair is decoded
/// once for all the panels.
pub(super) fn gemm<F: Block32>(
    n: usize,
    w_rows: &[&[u8]],
    panel: &[u8],
    scales: &[f32],
    groups: usize,
    out: &mut [f32],
) {
    let nb = n / 32;
    let rows = w_rows.len();
    let (qb, sb) = (nb * PANEL_BLOCK, nb * PANEL_SCALES);
    super::gemm::check_operands::<F>(nb, w_rows, panel, scales, groups, out);
    let mut dec = vec![0u8; P * nb * PAIR_BYTES];
    let (pn, sc, d) = (panel.as_ptr(), scales.as_ptr(), dec.as_mut_ptr());
    let o = out.as_mut_ptr();
    let row = |r: usize| w_rows[r].as_ptr();
    // The rows after `r + k` (contiguous in a matrix), or null at the end.
    let next = |r: usize| {
        if r < rows {
            row(r)
        } else {
            std::ptr::null()
        }
    };
    let mut r = 0;
    // SAFETY (all calls): the table holding this entry calls it only after
    // `available()`; `check_operands` bounds every read of the rows, panels and
    // scales and every write of `out` (8 floats per row and group, the
    // odd last row through `two`), and `dec` holds P pairs.
    while r + 2 * P <= rows {
        let w = std::array::from_fn(|p| [row(r + 2 * p), row(r + 2 * p + 1)]);
        unsafe { decode::<F, P>(nb, w, d) };
        for g in 0..groups {
            let ahead = if g == 0 {
                next(r + 2 * P)
            } else {
                std::ptr::null()
            };
            let (pg, sg, og) = (
                pn.wrapping_add(g * qb),
                sc.wrapping_add(g * sb),
                o.wrapping_add((g * rows + r) * C),
            );
            unsafe { compute::<F, P>(nb, d, pg, sg, og, ahead) };
        }
        r += 2 * P;
    }
    while r < rows {
        // A pair, or a last odd row as a pair with itself.
        let both = r + 2 <= rows;
        let w = [[row(r), row(if both { r + 1 } else { r })]];
        unsafe { decode::<F, 1>(nb, w, d) };
        for g in 0..groups {
            let (pg, sg) = (pn.wrapping_add(g * qb), sc.wrapping_add(g * sb));
            let mut two = [0f32; 2 * C];
            unsafe { compute::<F, 1>(nb, d, pg, sg, two.as_mut_ptr(), std::ptr::null()) };
            let k = if both { 2 } else { 1 };
            out[(g * rows + r) * C..(g * rows + r + k) * C].copy_from_slice(&two[..k * C]);
        }
        r += if both { 2 } else { 1 };
    }
}
