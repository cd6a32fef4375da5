//! The tile kernel of the 32-element formats on CPUs with AVX-512 VNNI:
//! sixteen weight rows in the sixteen i32 lanes, against up to eight
//! activation rows, for decode steps, speculative verification and small
//! batches. The twin of `tile32` in `mod.rs`, with the same bits.
//!
//! Why this shape: the AVX2 tile lays one row's elements across the lanes,
//! so every activation column costs a full decode of the weights and a
//! horizontal sum per block. Here the sixteen rows' decoded blocks are
//! transposed once (vector `j` holds elements `4j..4j + 4` of each row),
//! after which a column costs eight `vpdpbusd` per block for all sixteen
//! rows, its four activation bytes broadcast from memory. Extra columns
//! (draft tokens under verification, other sequences in a batch) are
//! nearly free next to streaming the weights.
//!
//! Signed formats are multiplied in their unsigned storage form and the
//! offset times the column's block sum is subtracted, as in `gemm_vnni`.
//! The float tail per (row, column) is the decode kernel's: per block
//! `acc = fma(isum, d_w * d_a, acc)` and `mins = mins + m_w * s_a`, then
//! `acc + mins`.

use std::arch::x86_64::*;

use super::{f16_at, read_u32, Block32};

/// Tokens of one product up to which this tile is used rather than the
/// GEMM (`quant::tile_tokens`). A SmolLM2 Q4_1 step of r rows, ms, tile
/// against GEMM: r=4 9.8 / 14.7, r=6 12.5 / 16.1, r=8 16.7 / 16.5, r=9
/// 20.3 / 22.5 (one decode step 6.9).
pub(super) const WIDE_TOKENS: usize = 9;

/// Weight rows per pass: the sixteen i32 lanes of a 512-bit vector.
const ROWS: usize = 16;

/// Activation columns per pass (each further pass decodes the weights
/// again).
const COLS: usize = 8;

/// Vector `j` of the result holds the four bytes `4j..4j + 4` of each of
/// the sixteen decoded blocks `r`, in row order.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
pub(super) fn transpose(r: [__m256i; ROWS]) -> [__m512i; 8] {
    // Row k in the low half, row k + 8 in the high half; the 32- then
    // 64-bit interleaves work within 128-bit lanes, and the last step
    // gathers lane 0 (or 1) of each half of two vectors.
    let z: [__m512i; 8] =
        std::array::from_fn(|k| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(r[k]), r[k + 8]));
    let a0 = _mm512_unpacklo_epi32(z[0], z[1]);
    let a1 = _mm512_unpackhi_epi32(z[0], z[1]);
    let a2 = _mm512_unpacklo_epi32(z[2], z[3]);
    let a3 = _mm512_unpackhi_epi32(z[2], z[3]);
    let a4 = _mm512_unpacklo_epi32(z[4], z[5]);
    let a5 = _mm512_unpackhi_epi32(z[4], z[5]);
    let a6 = _mm512_unpacklo_epi32(z[6], z[7]);
    let a7 = _mm512_unpackhi_epi32(z[6], z[7]);
    let b0 = _mm512_unpacklo_epi64(a0, a2);
    let b1 = _mm512_unpackhi_epi64(a0, a2);
    let b2 = _mm512_unpacklo_epi64(a1, a3);
    let b3 = _mm512_unpackhi_epi64(a1, a3);
    let b4 = _mm512_unpacklo_epi64(a4, a6);
    let b5 = _mm512_unpackhi_epi64(a4, a6);
    let b6 = _mm512_unpacklo_epi64(a5, a7);
    let b7 = _mm512_unpackhi_epi64(a5, a7);
    let lo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
    let hi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    [
        _mm512_permutex2var_epi64(b0, lo, b4),
        _mm512_permutex2var_epi64(b1, lo, b5),
        _mm512_permutex2var_epi64(b2, lo, b6),
        _mm512_permutex2var_epi64(b3, lo, b7),
        _mm512_permutex2var_epi64(b0, hi, b4),
        _mm512_permutex2var_epi64(b1, hi, b5),
        _mm512_permutex2var_epi64(b2, hi, b6),
        _mm512_permutex2var_epi64(b3, hi, b7),
    ]
}

/// Sixteen rows `w` against `NC` activation rows `a`; `out[c][r]`.
/// `asum[c * nb + i]` is column c's block-i quant sum (read only for the
/// signed formats). `ahead`, when not null, is prefetched a slice per
/// block (the rows the next pass reads).
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 F/VL and VNNI are available; every row holds
/// `nb` weight blocks and every column `nb` activation blocks; `asum`
/// holds `NC * nb` sums when `F::OFFSET != 0`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn pass<F: Block32, const NC: usize>(
    nb: usize,
    w: &[*const u8; ROWS],
    a: [*const u8; NC],
    asum: &[i32],
    ahead: *const u8,
) -> [[f32; ROWS]; NC] {
    let step = ROWS * F::W;
    let split_mins = NC > 4;
    let even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    let odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    let mut acc = [_mm512_setzero_ps(); NC];
    let mut mins = [_mm512_setzero_ps(); NC];
    for i in 0..nb {
        if !ahead.is_null() {
            crate::simd::prefetch_bytes(ahead.wrapping_add(i * step), step + 64);
        }
        // SAFETY: block i of every row is in bounds (caller's contract).
        let (t, words) = unsafe {
            let q: [__m256i; ROWS] = std::array::from_fn(|k| F::uquants(w[k].add(i * F::W)));
            let words: [u32; ROWS] = std::array::from_fn(|k| read_u32(w[k].add(i * F::W)));
            (transpose(q), words)
        };
        // The rows' (scale, min) f16 pairs: scales in the even halves,
        // minimums in the odd ones.
        // SAFETY: `words` holds sixteen u32.
        let sc = unsafe { _mm512_loadu_si512(words.as_ptr() as *const __m512i) };
        let lo = _mm512_cvtph_ps(_mm512_castsi512_si256(sc));
        let hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(sc));
        let dw = if F::F16_SCALES {
            _mm512_permutex2var_ps(lo, even, hi)
        } else {
            // SAFETY: block i of every row is in bounds.
            let d: [f32; ROWS] =
                std::array::from_fn(|k| _mm_cvtss_f32(unsafe { F::scales(w[k].add(i * F::W)) }));
            // SAFETY: sixteen floats.
            unsafe { _mm512_loadu_ps(d.as_ptr()) }
        };
        let mw = _mm512_permutex2var_ps(lo, odd, hi);
        // Columns four at a time against the transposed block, with two
        // partial sums per column over even and odd groups: the chains
        // interleave, so no `vpdpbusd` waits on the one before it (integer
        // sums: the split cannot change them). Measured against one sum
        // per column of four: 6 and 7 rows 20-40% faster.
        for c0 in (0..NC).step_by(4) {
            let cn = (NC - c0).min(4);
            let mut s = [[_mm512_setzero_si512(); 2]; 4];
            for (j, tj) in t.iter().enumerate() {
                for (c, sc) in s.iter_mut().enumerate().take(cn) {
                    // SAFETY: bytes 4j..4j + 4 of column c0 + c's block i,
                    // whose quants are its last 32 bytes.
                    let four = unsafe { read_u32(a[c0 + c].add(i * F::A + F::A - 32 + 4 * j)) };
                    sc[j % 2] = _mm512_dpbusd_epi32(sc[j % 2], *tj, _mm512_set1_epi32(four as i32));
                }
            }
            for (c, sc) in s.iter().enumerate().take(cn) {
                let col = c0 + c;
                let mut s = _mm512_add_epi32(sc[0], sc[1]);
                if F::OFFSET != 0 {
                    // |sum| <= 32 * 128 and OFFSET <= 128: exact in i32.
                    s = _mm512_sub_epi32(s, _mm512_set1_epi32(asum[col * nb + i] * F::OFFSET));
                }
                // SAFETY: block i of the column is in bounds.
                let da = unsafe { f16_at(a[col].add(i * F::A)) };
                let prod = _mm512_mul_ps(dw, _mm512_set1_ps(da));
                acc[col] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), prod, acc[col]);
                if F::MIN && !split_mins {
                    // SAFETY: Q8_1's sum `s` is the f16 at byte 2.
                    let sa = unsafe { f16_at(a[col].add(i * F::A + 2)) };
                    mins[col] = _mm512_add_ps(mins[col], _mm512_mul_ps(mw, _mm512_set1_ps(sa)));
                }
            }
        }
    }
    // Past four columns the minimums' sums take a second walk over the
    // blocks (the rows' few scale words are still in L1), with the same
    // per-block order and rounding. In the first walk their NC
    // accumulators, beside NC more for the products, eight of the
    // transposed block and eight partial sums, overflowed the 32 vector
    // registers from seven columns on: Q4_1 at eight columns spilled (a
    // SmolLM2 step of 8 rows took 16.7 ms against 13.0 for 7).
    if F::MIN && split_mins {
        for i in 0..nb {
            // SAFETY: as in the first walk.
            let words: [u32; ROWS] =
                std::array::from_fn(|k| unsafe { read_u32(w[k].add(i * F::W)) });
            // SAFETY: `words` holds sixteen u32.
            let sc = unsafe { _mm512_loadu_si512(words.as_ptr() as *const __m512i) };
            let lo = _mm512_cvtph_ps(_mm512_castsi512_si256(sc));
            let hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(sc));
            let mw = _mm512_permutex2var_ps(lo, odd, hi);
            for (col, m) in mins.iter_mut().enumerate() {
                // SAFETY: Q8_1's sum `s` is the f16 at byte 2 of block i.
                let sa = unsafe { f16_at(a[col].add(i * F::A + 2)) };
                *m = _mm512_add_ps(*m, _mm512_mul_ps(mw, _mm512_set1_ps(sa)));
            }
        }
    }
    let mut out = [[0f32; ROWS]; NC];
    for c in 0..NC {
        let v = if F::MIN {
            _mm512_add_ps(acc[c], mins[c])
        } else {
            acc[c]
        };
        // SAFETY: out[c] holds sixteen floats.
        unsafe { _mm512_storeu_ps(out[c].as_mut_ptr(), v) };
    }
    out
}

/// Runs `pass` for `m` (1 to COLS) columns from `c0`, into `out`.
///
/// # Safety
/// As `pass`, for columns `c0..c0 + m`.
unsafe fn columns<F: Block32>(
    nb: usize,
    w: &[*const u8; ROWS],
    acts: &[&[u8]],
    asum: &[i32],
    ahead: *const u8,
    (r0, c0, m, nc): (usize, usize, usize, usize),
    out: &mut [f32],
) {
    macro_rules! run {
        ($k:literal) => {{
            let a: [*const u8; $k] = std::array::from_fn(|c| acts[c0 + c].as_ptr());
            // SAFETY: the caller's contract, for these columns; `asum` is
            // offset to column c0.
            let v = unsafe { pass::<F, $k>(nb, w, a, &asum[(c0 * nb).min(asum.len())..], ahead) };
            for (c, col) in v.iter().enumerate() {
                for (r, x) in col.iter().enumerate() {
                    out[(r0 + r) * nc + c0 + c] = *x;
                }
            }
        }};
    }
    match m {
        1 => run!(1),
        2 => run!(2),
        3 => run!(3),
        4 => run!(4),
        5 => run!(5),
        6 => run!(6),
        7 => run!(7),
        _ => run!(8),
    }
}

/// Whether this CPU runs the kernel.
pub(super) fn available() -> bool {
    super::gemm_vnni::available()
}

/// `out[r * acts.len() + c]`: sixteen rows at a time through `pass`, the
/// rows past the last sixteen through the AVX2 tile.
pub(super) fn tile<F: Block32>(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]) {
    let nb = n / 32;
    let nc = acts.len();
    super::check_tile(nb, F::W, F::A, w_rows, acts, out);
    // Each column's block sums, for the signed formats' offsets.
    let asum: Vec<i32> = if F::OFFSET != 0 {
        acts.iter()
            .flat_map(|a| {
                a.chunks_exact(F::A)
                    .take(nb)
                    .map(|b| b[F::A - 32..].iter().map(|&q| q as i8 as i32).sum::<i32>())
            })
            .collect()
    } else {
        Vec::new()
    };
    let full = w_rows.len() / ROWS * ROWS;
    for r0 in (0..full).step_by(ROWS) {
        let w: [*const u8; ROWS] = std::array::from_fn(|k| w_rows[r0 + k].as_ptr());
        let next = w_rows
            .get(r0 + ROWS)
            .map_or(std::ptr::null(), |r| r.as_ptr());
        for c0 in (0..nc).step_by(COLS) {
            // The next rows are fetched during the first columns' pass.
            let ahead = if c0 == 0 { next } else { std::ptr::null() };
            let m = (nc - c0).min(COLS);
            // SAFETY: the table holding this entry calls it only after
            // `available()`; check_tile bounds every block of the rows and
            // columns, and `asum` holds nb sums per column when needed.
            unsafe { columns::<F>(nb, &w, acts, &asum, ahead, (r0, c0, m, nc), out) };
        }
    }
    if full < w_rows.len() {
        super::tile32::<F>(n, &w_rows[full..], acts, &mut out[full * nc..]);
    }
}
