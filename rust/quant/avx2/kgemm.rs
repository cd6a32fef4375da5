//! The GEMM microkernel for Q4_K and Q6_K against a Q8_K panel: weight
//! rows, one at a time, against eight activation columns in the eight
//! lanes of one accumulator (as `gemm.rs` does for the 32-element formats).
//!
//! Each weight row is first decoded into 256 unsigned values per
//! super-block in element order plus its integer scale words; then for
//! every group of four elements one `maddubs` of the four weight bytes
//! (broadcast) against the panel's group (four elements of each column)
//! and one `madd` by the group's scale (the same i16 in both halves of the
//! word) advance all eight columns exactly. The mins (Q4_K) or the -32
//! offset (Q6_K) meet the panel's transposed group sums in `madd`s too.
//!
//! Bits: every kernel of these formats (the scalar reference, the decode
//! and tile kernels `q4_k.rs` and `q6_k.rs`, this one and the AVX-512 one)
//! forms each super-block's integer sum (and Q4_K's mins sum) exactly,
//! turns them into the block's value as the scalar reference does,
//! `(d_w * d_a) * isum - (dmin_w * d_a) * summ`, and adds the values in
//! block order from +0.0. So every (row, column) has the same bits on
//! every path and every CPU: a token's logits are the same alone, in a
//! prefill or in a batch.

use std::arch::x86_64::*;

use super::{f16_at, f16_pair, load, load128, read_u32};
use crate::quant::kquant_scales::scales_mins;
use crate::quant::panel::{KPANEL_BLOCK, KPANEL_SCALES};
use crate::quant::{q4_k, q6_k, GEMM_COLS, QK_K};

// The AVX-512 VNNI kernel (sixteen rows in the lanes, same bits): a
// child module, so that it shares the decoded form and the formats
// without widening their visibility.
#[path = "kgemm_avx512.rs"]
mod avx512;

const C: usize = GEMM_COLS;

/// Row tile: one row at a time, so that its eight lane sums stay in
/// registers (two rows sharing each panel load measured 12% slower for
/// Q4_K and 25% for Q6_K: the sixteen sums spill).
const R: usize = 1;

/// Decoded bytes per (row, super-block): 256 values, 16 scale words and
/// eight correction words (u32 each).
pub(super) const DEC: usize = QK_K + 4 * 16 + 4 * 8;
/// Offset of the scale words in a decoded block.
pub(super) const SCALES: usize = QK_K;
/// Offset of the correction words in a decoded block.
pub(super) const CORR: usize = QK_K + 4 * 16;
/// Offset of the transposed group sums in a panel super-block.
const BSUMS: usize = 64 * 32;

/// A K-quant weight format with a GEMM microkernel.
pub(super) trait KFormat {
    /// Weight block bytes.
    const W: usize;
    /// Groups of four elements per scale: 8 (Q4_K's 32) or 4 (Q6_K's 16).
    const GROUP: usize;
    /// Q4_K: the correction is the mins' dot, scaled by `dmin` in float;
    /// Q6_K: it is the offset's, subtracted (times 32) in the integer sum.
    const MIN: bool;
    /// Writes block `bw`'s decoded form (`DEC` bytes) to `dst`: values in
    /// element order, then the i16 scale of each group in both halves of a
    /// word, then for k < 8 the word whose `madd` with the group sums pair
    /// (2k, 2k + 1) gives the block's correction for them.
    unsafe fn decode(bw: *const u8, dst: *mut u8);
    /// Lane 0: the block's `d`; lane 1: its `dmin` when `MIN`.
    unsafe fn scales(bw: *const u8) -> __m128;
}

struct Q4K;
struct Q6K;

impl KFormat for Q4K {
    const W: usize = q4_k::BLOCK;
    const GROUP: usize = 8;
    const MIN: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(bw: *const u8, dst: *mut u8) {
        let m4 = _mm256_set1_epi8(0x0f);
        for j in 0..4 {
            // SAFETY: 32 quant bytes per 64 elements from offset 16; dst
            // holds DEC bytes (caller's contract).
            unsafe {
                let q = load(bw.add(16 + 32 * j));
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                _mm256_storeu_si256(dst.add(64 * j) as *mut __m256i, lo);
                _mm256_storeu_si256(dst.add(64 * j + 32) as *mut __m256i, hi);
            }
        }
        // SAFETY: the 12 packed scale bytes are at 4..16.
        let (sc, mn) = scales_mins(unsafe { std::slice::from_raw_parts(bw.add(4), 12) });
        // Scale k (and min k) in both halves of word k.
        let words = |v: u64| {
            let h = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(v as i64));
            _mm256_set_m128i(_mm_unpackhi_epi16(h, h), _mm_unpacklo_epi16(h, h))
        };
        // SAFETY: the 8 scale and the 8 correction words of dst; min k
        // meets both group sums of sub-block k.
        unsafe {
            _mm256_storeu_si256(dst.add(SCALES) as *mut __m256i, words(sc));
            _mm256_storeu_si256(dst.add(CORR) as *mut __m256i, words(mn));
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(bw: *const u8) -> __m128 {
        // SAFETY: d and dmin are the block's first 4 bytes.
        unsafe { f16_pair(bw) }
    }
}

impl KFormat for Q6K {
    const W: usize = q6_k::BLOCK;
    const GROUP: usize = 4;
    const MIN: bool = false;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(bw: *const u8, dst: *mut u8) {
        for h in 0..2 {
            // SAFETY: the caller guarantees a whole block at bw.
            let v = unsafe { super::q6_k::half(bw, h) };
            for (k, vk) in v.iter().enumerate() {
                // SAFETY: elements 128h + 32k.. of the DEC bytes at dst.
                unsafe { _mm256_storeu_si256(dst.add(128 * h + 32 * k) as *mut __m256i, *vk) };
            }
        }
        // SAFETY: the 16 i8 scales are at 192..208.
        let sc = _mm256_cvtepi8_epi16(unsafe { load128(bw.add(192)) });
        let (lo, hi) = (_mm256_unpacklo_epi16(sc, sc), _mm256_unpackhi_epi16(sc, sc));
        // SAFETY: the 16 scale words (scale g in both halves of word g;
        // the unpacks work per 128-bit lane) and the 8 correction words
        // (word k: scales 2k and 2k + 1, the i16 array itself) of dst.
        unsafe {
            let st = |o: usize, v: __m256i| _mm256_storeu_si256(dst.add(o) as *mut __m256i, v);
            st(SCALES, _mm256_permute2x128_si256::<0x20>(lo, hi));
            st(SCALES + 32, _mm256_permute2x128_si256::<0x31>(lo, hi));
            st(CORR, sc);
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(bw: *const u8) -> __m128 {
        // SAFETY: d is the f16 at 208..210.
        _mm_set_ss(unsafe { f16_at(bw.add(208)) })
    }
}

/// Weight rows `w` (N of them, decoded into `dec`: `DEC` bytes per block)
/// against the panel; writes `out[r * 8 + c]`.
///
/// # Safety
/// AVX2, FMA and F16C are available; every row holds `nb` weight blocks,
/// `dec` `N * nb * DEC` bytes, `panel` `nb * KPANEL_BLOCK` bytes, `scales`
/// `nb * KPANEL_SCALES` floats and `out` `N * 8` floats.
// `l` and `r` index several arrays (lanes, rows) at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows<F: KFormat, const N: usize>(
    nb: usize,
    w: [*const u8; N],
    dec: *mut u8,
    panel: *const u8,
    scales: *const f32,
    out: *mut f32,
) {
    for (r, w) in w.iter().enumerate() {
        for i in 0..nb {
            // SAFETY: block i of row r is in bounds, and so is its DEC-byte
            // slot in `dec` (caller's contract).
            unsafe { F::decode(w.add(i * F::W), dec.add((r * nb + i) * DEC)) };
        }
    }
    // acc[r]: row r's sum over the blocks so far, for the eight columns.
    let mut acc = [_mm256_setzero_ps(); N];
    for i in 0..nb {
        let pb = panel.wrapping_add(i * KPANEL_BLOCK);
        let db: [*const u8; N] =
            std::array::from_fn(|r| dec.wrapping_add((r * nb + i) * DEC) as *const u8);
        // SAFETY: block i's eight scales are in `scales`.
        let da = unsafe { _mm256_loadu_ps(scales.add(i * KPANEL_SCALES)) };
        // SAFETY: block i of each row is in bounds.
        let dm: [__m128; N] = std::array::from_fn(|r| unsafe { F::scales(w[r].add(i * F::W)) });
        let prod: [__m256; N] =
            std::array::from_fn(|r| _mm256_mul_ps(_mm256_broadcastss_ps(dm[r]), da));
        let mut s = [[_mm256_setzero_si256(); 8]; N];
        let mut group = |p: usize, l: usize| {
            let jj = 8 * p + l;
            // SAFETY: group jj of super-block i is inside the panel.
            let a = unsafe { load(pb.add(jj * 32)) };
            for r in 0..N {
                // SAFETY: bytes 4jj..4jj + 4 of row r's decoded block i
                // and the scale word of their group.
                let (wj, sw) = unsafe {
                    (
                        read_u32(db[r].add(4 * jj)),
                        read_u32(db[r].add(SCALES + 4 * (jj / F::GROUP))),
                    )
                };
                let q = _mm256_maddubs_epi16(_mm256_set1_epi32(wj as i32), a);
                let q = _mm256_madd_epi16(q, _mm256_set1_epi32(sw as i32));
                s[r][l] = _mm256_add_epi32(s[r][l], q);
            }
        };
        // Sub-block (run of 32) outer, lane inner: each row's eight lane
        // sums stay in registers while its scale word is reused.
        for p in 0..8 {
            for l in 0..8 {
                group(p, l);
            }
        }
        for r in 0..N {
            // The block's integer (exact in any order), then the
            // correction: Q6_K's offset in it, Q4_K's mins beside it.
            let mut isum = _mm256_setzero_si256();
            let mut corr = _mm256_setzero_si256();
            for l in 0..8 {
                isum = _mm256_add_epi32(isum, s[r][l]);
                // SAFETY: group-sum pair l of the panel's super-block and
                // correction word l of row r's decoded block i.
                let (b, cw) = unsafe {
                    (
                        load(pb.add(BSUMS + 32 * l)),
                        read_u32(db[r].add(CORR + 4 * l)),
                    )
                };
                corr = _mm256_add_epi32(corr, _mm256_madd_epi16(b, _mm256_set1_epi32(cw as i32)));
            }
            // The scalar reference's block value, to the bit.
            let v = if F::MIN {
                let m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm[r]));
                let mprod = _mm256_mul_ps(m, da);
                _mm256_sub_ps(
                    _mm256_mul_ps(prod[r], _mm256_cvtepi32_ps(isum)),
                    _mm256_mul_ps(mprod, _mm256_cvtepi32_ps(corr)),
                )
            } else {
                let isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(corr, 5));
                _mm256_mul_ps(prod[r], _mm256_cvtepi32_ps(isum))
            };
            acc[r] = _mm256_add_ps(acc[r], v);
        }
    }
    for r in 0..N {
        // SAFETY: out holds 8 floats per row.
        unsafe { _mm256_storeu_ps(out.add(r * C), acc[r]) };
    }
}

/// Safe entry: checks every length the kernel reads, then runs it.
fn gemm<F: KFormat>(n: usize, w_rows: &[&[u8]], panel: &[u8], scales: &[f32], out: &mut [f32]) {
    let nb = n / QK_K;
    assert!(
        w_rows.iter().all(|w| w.len() >= nb * F::W)
            && panel.len() >= nb * KPANEL_BLOCK
            && scales.len() >= nb * KPANEL_SCALES
            && out.len() >= w_rows.len() * C,
        "gemm operand too short"
    );
    let mut dec = vec![0u8; R * nb * DEC];
    let (p, s, d) = (panel.as_ptr(), scales.as_ptr(), dec.as_mut_ptr());
    let mut r = 0;
    while r + R <= w_rows.len() {
        let w = std::array::from_fn(|k| w_rows[r + k].as_ptr());
        // SAFETY: the table holding this function is installed only after
        // AVX2, FMA and F16C were detected; the assert bounds every read of
        // the rows, panel and scales, `dec` holds R rows of nb decoded
        // blocks, and `out` 8 floats for each row.
        unsafe { rows::<F, R>(nb, w, d, p, s, out[r * C..].as_mut_ptr()) };
        r += R;
    }
}

/// Q4_K rows against a Q8_K panel (see `GemmFn`; `_acts` is for the
/// scalar twin).
pub fn gemm_q4_k(
    n: usize,
    w_rows: &[&[u8]],
    _acts: &[&[u8]],
    quants: &[u8],
    scales: &[f32],
    out: &mut [f32],
) {
    gemm::<Q4K>(n, w_rows, quants, scales, out)
}

/// Q6_K rows against a Q8_K panel.
pub fn gemm_q6_k(
    n: usize,
    w_rows: &[&[u8]],
    _acts: &[&[u8]],
    quants: &[u8],
    scales: &[f32],
    out: &mut [f32],
) {
    gemm::<Q6K>(n, w_rows, quants, scales, out)
}

/// Whether `gemm_q4_k_avx512` and `gemm_q6_k_avx512` may be called: the
/// CPU has AVX-512 VNNI (and neither `OXILLAMA_VNNI=0` nor
/// `OXILLAMA_KGEMM512=0` is set). Decided once.
pub fn avx512_enabled() -> bool {
    avx512::enabled()
}

/// Whether the CPU has the AVX-512 VNNI kernel (whatever the switches
/// say), for the twin tests.
#[cfg(test)]
pub fn avx512_available() -> bool {
    avx512::available()
}

/// Rows of any `KFormat` against Q8_K activation rows on the AVX-512 VNNI
/// kernel (see `gemm_q4_k_avx512`): for the formats defined beside their
/// other kernels (`iquants.rs`). Call only when `avx512_enabled()`.
pub(super) fn gemm_avx512<F: KFormat>(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]) {
    avx512::gemm::<F>(n, w_rows, acts, out)
}

pub(crate) use avx512::Nibbles;

/// Row groups of a packed 4-bit-code matrix (the grid i-quants', IQ4_XS's)
/// against Q8_K activation rows on the AVX-512 VNNI kernel, its slots
/// built from the packed copy. Call only when `avx512_enabled()`.
pub(super) fn gemm_nibbles(
    lay: &Nibbles,
    n: usize,
    packed: &[u8],
    groups: (usize, usize),
    acts: &[&[u8]],
    out: &mut [f32],
) {
    avx512::gemm_nibbles(lay, n, packed, groups, acts, out)
}

/// Q4_K rows against Q8_K activation rows (`GemmFn`'s contract; the
/// panels are not read) on the AVX-512 VNNI kernel. Same bits as
/// `gemm_q4_k`. Call only when `avx512_enabled()`.
pub fn gemm_q4_k_avx512(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]) {
    avx512::gemm::<Q4K>(n, w_rows, acts, out)
}

/// Q6_K rows against Q8_K activation rows (see `gemm_q4_k_avx512`).
pub fn gemm_q6_k_avx512(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]) {
    avx512::gemm::<Q6K>(n, w_rows, acts, out)
}
