//! AVX2 + FMA + F16C kernels. `mod.rs` installs them only after run-time
//! detection, so a baseline x86-64 build still takes these paths where it can.
//!
//! Every public function here is safe to call once `available()` returned
//! true: it checks the buffer lengths it reads (panicking, never reading out
//! of bounds, on a caller's broken contract) before entering the
//! `#[target_feature]` code.
//!
//! Integer technique (as in ggml): `maddubs` multiplies unsigned weight bytes
//! by signed activation bytes into i16 pairs, `madd` by ones (or by the
//! group's scale) widens to i32. Signed weights move their sign onto the
//! activation first (`sign_epi8`). Formats with an offset (Q6_K's -32,
//! Q3_K's -4) multiply the unsigned value and subtract the offset times
//! Q8_K's precomputed group sums.

use std::arch::x86_64::*;

pub use crate::simd::x86::hsum;

mod float;
mod gemm;
mod gemm_vnni;
pub mod grid_packed;
mod iq4_nl;
pub mod iq4xs_packed;
mod iquants;
mod kgemm;
mod mxfp4;
mod packed_groups;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
pub mod q4_packed;
pub mod q4k_packed;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
pub mod q6k_packed;
mod q8_0;
pub mod q8_0_packed;
mod quantize;
mod rows16_vnni;
pub mod tq2_packed;

pub use float::{vec_dot_bf16, vec_dot_f16, vec_dot_f32};
pub use iq4_nl::{gemm_iq4_nl, tile_iq4_nl, vec_dot_iq4_nl};
pub use iquants::*;
pub use mxfp4::{gemm_mxfp4, tile_mxfp4, vec_dot_mxfp4};
pub use q2_k::{tile_q2_k, vec_dot_q2_k};
pub use q3_k::{tile_q3_k, vec_dot_q3_k};
pub use q4_0::{gemm_q4_0, tile_q4_0, vec_dot_q4_0};
pub use q4_1::{gemm_q4_1, tile_q4_1, vec_dot_q4_1};
pub use q4_k::{tile_q4_k, vec_dot_q4_k};
pub use q5_0::{gemm_q5_0, tile_q5_0, vec_dot_q5_0};
pub use q5_1::{gemm_q5_1, tile_q5_1, vec_dot_q5_1};
pub use q5_k::{tile_q5_k, vec_dot_q5_k};
pub use q6_k::{tile_q6_k, vec_dot_q6_k};
pub use q8_0::{gemm_q8_0, tile_q8_0, vec_dot_q8_0};
pub use quantize::{quantize_q8_0, quantize_q8_1, quantize_q8_k};

use super::q8_k;

pub fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// 32 bytes from `p`, unaligned.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: callers pass a pointer to 32 readable bytes.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// 16 bytes from `p`, unaligned.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load128(p: *const u8) -> __m128i {
    // SAFETY: callers pass a pointer to 16 readable bytes.
    unsafe { _mm_loadu_si128(p as *const __m128i) }
}

/// Little-endian u32 at `p`, unaligned.
#[inline]
unsafe fn read_u32(p: *const u8) -> u32 {
    // SAFETY: callers pass a pointer to 4 readable bytes.
    u32::from_le(unsafe { (p as *const u32).read_unaligned() })
}

/// Little-endian f32 at `p`, unaligned.
#[inline]
unsafe fn read_f32(p: *const u8) -> f32 {
    // SAFETY: callers pass a pointer to 4 readable bytes.
    f32::from_bits(unsafe { read_u32(p) })
}

/// The two f16 values at `p` (a block's scale and min/sum) as lanes 0 and 1.
/// One 32-bit move, not two 16-bit lane inserts: `vpinsrw` merges into a
/// register, which the compiler may share with an accumulator and so chain
/// every block's scale load behind the previous block's FMA.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_pair(p: *const u8) -> __m128 {
    // SAFETY: callers pass a pointer to 4 readable bytes.
    let bits = unsafe { read_u32(p) };
    _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))
}

/// `v` as f16 (nearest even, as `half` and ggml round) at byte `i` of `b`,
/// converted in a register where the quantizers run rather than by a call
/// per block.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn put_f16(b: &mut [u8], i: usize, v: f32) {
    let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(v));
    b[i..i + 2].copy_from_slice(&(_mm_extract_epi16::<0>(h) as u16).to_le_bytes());
}

/// The f16 at `p` as f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: callers pass a pointer to 2 readable bytes.
    let bits = unsafe { u16::from_le_bytes([*p, *p.add(1)]) };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Expands 16 bytes of nibbles into 32 bytes: low nibbles then high nibbles.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: callers pass a pointer to 16 readable bytes.
    let raw = unsafe { load128(p) };
    let m = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(raw, m);
    let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m);
    _mm256_set_m128i(hi, lo)
}

/// Byte k is 0xFF where bit k of `bits` is set, 0 elsewhere.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bit_bytes(bits: u32) -> __m256i {
    // Byte k takes byte k / 8 of the word, then keeps only bit k % 8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select)
}

/// Sum of the eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    hsum_i32x4(_mm_add_epi32(
        _mm256_castsi256_si128(v),
        _mm256_extracti128_si256(v, 1),
    ))
}

/// Sum of the four i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum_i32x4(v: __m128i) -> i32 {
    let s = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01));
    _mm_cvtsi128_si32(s)
}

/// Shuffle control that turns 16 i8 group scales into pair `p`: eight
/// copies of scale `2p` then eight of scale `2p + 1` (for `cvtepi8_epi16`,
/// giving the i16 multipliers of one 32-byte run: two groups of 16).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scale_pair_mask(p: usize) -> __m128i {
    const ONES: i64 = 0x0101_0101_0101_0101;
    _mm_set_epi64x((2 * p as i64 + 1) * ONES, 2 * p as i64 * ONES)
}

/// The i16 multipliers for the 32 elements of run `p` (groups 2p, 2p+1).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scale_pair(scales8: __m128i, p: usize) -> __m256i {
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales8, scale_pair_mask(p)))
}

// ---------------------------------------------------------------------------
// 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) share one driver.
//
// Arithmetic, the same in every kernel below and in the GEMM microkernel:
// each block's integer dot is formed exactly as an i32 (the order of integer
// additions cannot change it), then, per (row, column) and in block order,
// `acc = fma(isum, d_w * d_a, acc)` and, for formats with a minimum,
// `mins = mins + m_w * s_a`; the result is `acc + mins`. So whatever way a
// kernel lays its lanes out (over columns in the GEMM, over rows in decode,
// one scalar in `dot1`) each (row, column) gets the same bits, and a
// sequence decoded alone gets the logits it gets inside a batch.

/// One 32-element block format paired with Q8_0 or Q8_1 activations.
trait Block32 {
    /// Weight block bytes.
    const W: usize;
    /// Activation block bytes: 34 (Q8_0) or 36 (Q8_1, quants from byte 4).
    const A: usize;
    /// The weight values are unsigned (else signed, their sign moved onto
    /// the activation so `maddubs` sees an unsigned operand).
    const UNSIGNED: bool;
    /// The weight has a minimum, multiplied by Q8_1's `s` (lane 1 below).
    const MIN: bool;
    /// How many `maddubs` results (each lane a sum of two products) may be
    /// added as i16 before widening: `2 * FOLD * max|w| * 128 < 2^15`.
    const FOLD: usize;
    /// What `uquants` adds to each value to make it unsigned (0 for the
    /// unsigned formats).
    const OFFSET: i32;
    /// The 32 weight values of the block at `p`, in element order.
    unsafe fn quants(p: *const u8) -> __m256i;
    /// The same values plus `OFFSET`, as unsigned bytes (`vpdpbusd`'s
    /// unsigned operand): the storage form before the format's offset.
    unsafe fn uquants(p: *const u8) -> __m256i;
    /// Lane 0: the block's scale; lane 1: its minimum when `MIN`.
    unsafe fn scales(p: *const u8) -> __m128;
    /// The block starts with its scale (and minimum) as f16, which the
    /// many-row kernels convert several rows at a time; else they ask
    /// `scales` row by row (MXFP4's exponent byte).
    const F16_SCALES: bool = true;
}

/// i16 pair sums of weight bytes `w` times activation bytes `a`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn products<F: Block32>(w: __m256i, a: __m256i) -> __m256i {
    if F::UNSIGNED {
        _mm256_maddubs_epi16(w, a)
    } else {
        _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w))
    }
}

/// i16 lanes widened to i32 by summing adjacent pairs.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn widen(p: __m256i) -> __m256i {
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// The exact integer dot of one weight block with one activation block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_isum<F: Block32>(qw: __m256i, qa: __m256i) -> i32 {
    hsum_i32(widen(products::<F>(qw, qa)))
}

/// One row against one column, one scalar accumulator in block order.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot1<F: Block32>(nb: usize, w: *const u8, a: *const u8) -> f32 {
    let mut acc = _mm_setzero_ps();
    let mut mins = _mm_setzero_ps();
    for i in 0..nb {
        // SAFETY: the caller guarantees nb whole blocks on both sides; each
        // starts with its scales and ends with its 32 quants.
        let (qa, da, qw, dw) = unsafe {
            let (ba, bw) = (a.add(i * F::A), w.add(i * F::W));
            (
                load(ba.add(F::A - 32)),
                f16_pair(ba),
                F::quants(bw),
                F::scales(bw),
            )
        };
        // Lane 0: d_w * d_a; lane 1: m_w * s_a.
        let prod = _mm_mul_ps(dw, da);
        let s = _mm_cvtsi32_ss(_mm_setzero_ps(), block_isum::<F>(qw, qa));
        acc = _mm_fmadd_ss(s, prod, acc);
        mins = _mm_add_ps(mins, prod);
    }
    let s = _mm_cvtss_f32(acc);
    if F::MIN {
        s + _mm_cvtss_f32(_mm_shuffle_ps(mins, mins, 1))
    } else {
        s
    }
}

/// Four weight rows against one activation column: the decode kernel, with
/// the four rows in the lanes of one accumulator.
///
/// Per block: the four rows' exact sums are folded into one vector by
/// horizontal adds, their four scale pairs converted and multiplied as one
/// vector, then one FMA and one minimum add serve all four rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_rows4<F: Block32>(nb: usize, w: [*const u8; 4], a: *const u8) -> [f32; 4] {
    // Decode streams the weights from memory once per token: prefetch the
    // same block of the next four rows (contiguous after these) so their
    // fetch overlaps this group's arithmetic. A prefetch never faults, so
    // running past the end of the matrix is harmless.
    let ahead = 4 * nb * F::W;
    // [d_0 d_1 d_2 d_3 | m_0 m_1 m_2 m_3] from interleaved (d, m) pairs.
    let split = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    let mut acc = _mm_setzero_ps();
    let mut mins = _mm_setzero_ps();
    for i in 0..nb {
        // SAFETY: the caller guarantees nb whole blocks on both sides; every
        // block starts with its 4 bytes of scales.
        let (qa, das, dm) = unsafe {
            let ba = a.add(i * F::A);
            let bw = w.map(|p| p.add(i * F::W));
            (
                load(ba.add(F::A - 32)),
                f16_pair(ba),
                if F::F16_SCALES {
                    _mm256_cvtph_ps(_mm_set_epi32(
                        read_u32(bw[3]) as i32,
                        read_u32(bw[2]) as i32,
                        read_u32(bw[1]) as i32,
                        read_u32(bw[0]) as i32,
                    ))
                } else {
                    let d = bw.map(|p| _mm_cvtss_f32(F::scales(p)));
                    _mm256_setr_ps(d[0], 0.0, d[1], 0.0, d[2], 0.0, d[3], 0.0)
                },
            )
        };
        // [d_a, s_a] in every 64-bit lane, against [d_r, m_r] of row r.
        let da = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(das)));
        let p = _mm256_permutevar8x32_ps(_mm256_mul_ps(dm, da), split);
        let q: [__m256i; 4] = std::array::from_fn(|r| {
            let bw = w[r].wrapping_add(i * F::W);
            _mm_prefetch::<_MM_HINT_T0>(bw.wrapping_add(ahead) as *const i8);
            // SAFETY: as above.
            widen(products::<F>(unsafe { F::quants(bw) }, qa))
        });
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(q[0], q[1]), _mm256_hadd_epi32(q[2], q[3]));
        let s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(s), _mm256_castps256_ps128(p), acc);
        mins = _mm_add_ps(mins, _mm256_extractf128_ps(p, 1));
    }
    let out = if F::MIN { _mm_add_ps(acc, mins) } else { acc };
    let mut o = [0f32; 4];
    // SAFETY: `o` holds 4 floats.
    unsafe { _mm_storeu_ps(o.as_mut_ptr(), out) };
    o
}

/// Checks that every row holds `nb` blocks of `bytes` and `out` the product.
fn check_tile(nb: usize, wb: usize, ab: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &[f32]) {
    assert!(
        out.len() >= w_rows.len() * acts.len(),
        "tile output too short"
    );
    assert!(
        w_rows.iter().all(|w| w.len() >= nb * wb),
        "weight row too short"
    );
    assert!(
        acts.iter().all(|a| a.len() >= nb * ab),
        "activation row too short"
    );
}

/// `out[r * cols + c]`, column by column through the decode kernels (four
/// rows, then single rows). Several columns go through the GEMM instead.
fn tile32<F: Block32>(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]) {
    let nb = n / 32;
    let nc = acts.len();
    check_tile(nb, F::W, F::A, w_rows, acts, out);
    for (c, a) in acts.iter().enumerate() {
        let mut r = 0;
        while r < w_rows.len() {
            // SAFETY: AVX2/FMA/F16C were detected before the table holding
            // this function was installed; check_tile bounds every block.
            unsafe {
                if r + 4 <= w_rows.len() {
                    let w4 = std::array::from_fn(|k| w_rows[r + k].as_ptr());
                    for (k, x) in dot_rows4::<F>(nb, w4, a.as_ptr()).into_iter().enumerate() {
                        out[(r + k) * nc + c] = x;
                    }
                    r += 4;
                } else {
                    out[r * nc + c] = dot1::<F>(nb, w_rows[r].as_ptr(), a.as_ptr());
                    r += 1;
                }
            }
        }
    }
}

/// Public single-row entry point of a `Block32` format.
fn dot32<F: Block32>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / 32;
    assert!(
        w.len() >= nb * F::W && a.len() >= nb * F::A,
        "row too short"
    );
    // SAFETY: features detected at install time; the assert bounds all blocks.
    unsafe { dot1::<F>(nb, w.as_ptr(), a.as_ptr()) }
}

// ---------------------------------------------------------------------------
// K-quants: one weight super-block decoded once for up to KCOLS activations.

/// Activation rows handled together by the K-quant tiles.
const KCOLS: usize = 4;

/// A K-quant kernel: one weight row of `nb` super-blocks against C Q8_K rows.
type KDot<const C: usize> = unsafe fn(usize, *const u8, [*const u8; C]) -> [f32; C];

/// `out[r * cols + c]`, with each weight row against KCOLS, 2 or 1 columns.
fn tile_k(
    n: usize,
    wb: usize,
    w_rows: &[&[u8]],
    acts: &[&[u8]],
    out: &mut [f32],
    (d4, d2, d1): (KDot<KCOLS>, KDot<2>, KDot<1>),
) {
    let nb = n / super::QK_K;
    let nc = acts.len();
    check_tile(nb, wb, q8_k::BLOCK, w_rows, acts, out);
    for (r, w) in w_rows.iter().enumerate() {
        let o = &mut out[r * nc..(r + 1) * nc];
        let mut c = 0;
        // SAFETY (all three calls): features detected when the table was
        // installed; check_tile bounds every block read.
        while c + KCOLS <= nc {
            let v = unsafe {
                d4(
                    nb,
                    w.as_ptr(),
                    std::array::from_fn(|k| acts[c + k].as_ptr()),
                )
            };
            o[c..c + KCOLS].copy_from_slice(&v);
            c += KCOLS;
        }
        while c + 2 <= nc {
            let v = unsafe { d2(nb, w.as_ptr(), [acts[c].as_ptr(), acts[c + 1].as_ptr()]) };
            o[c..c + 2].copy_from_slice(&v);
            c += 2;
        }
        if c < nc {
            o[c] = unsafe { d1(nb, w.as_ptr(), [acts[c].as_ptr()])[0] };
        }
    }
}

/// Declares `vec_dot_*` and `tile_*` for a K-quant whose kernel is
/// `dot::<C>` in the current module.
macro_rules! kquant_entries {
    ($vec_dot:ident, $tile:ident, $wb:expr) => {
        pub fn $vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = n / crate::quant::QK_K;
            assert!(
                w.len() >= nb * $wb && a.len() >= nb * crate::quant::q8_k::BLOCK,
                "row too short"
            );
            // SAFETY: features detected at install time; the assert bounds all blocks.
            unsafe { dot::<1>(nb, w.as_ptr(), [a.as_ptr()])[0] }
        }

        pub fn $tile(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]) {
            super::tile_k(
                n,
                $wb,
                w_rows,
                acts,
                out,
                (dot::<{ super::KCOLS }>, dot::<2>, dot::<1>),
            )
        }
    };
}
use kquant_entries;

/// Whether the AVX-512 VNNI twins run: the CPU has them, and
/// OXILLAMA_VNNI=0 does not keep the AVX2 kernels (to compare the two in
/// separate processes; the bits are the same either way).
pub fn vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VNNI.get_or_init(|| {
        gemm_vnni::available() && std::env::var_os("OXILLAMA_VNNI").is_none_or(|v| v != "0")
    })
}

/// The tile of a `Block32` format: sixteen rows in the lanes where the CPU
/// has AVX-512 VNNI (same bits), else the AVX2 tile.
fn tile_block32<F: Block32>(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]) {
    if vnni() && rows16_vnni::available() {
        rows16_vnni::tile::<F>(n, w_rows, acts, out)
    } else {
        tile32::<F>(n, w_rows, acts, out)
    }
}

/// Tokens up to which the sixteen-rows tile beats the GEMM, for the
/// 32-element formats on a CPU with AVX-512 VNNI (`None` otherwise).
pub fn wide_tile_tokens(ty: crate::quant::GgmlType) -> Option<usize> {
    use crate::quant::GgmlType as T;
    let block32 = matches!(ty, T::Q4_0 | T::Q4_1 | T::Q5_0 | T::Q5_1 | T::Q8_0);
    (block32 && vnni() && rows16_vnni::available()).then_some(rows16_vnni::WIDE_TOKENS)
}

/// Whether the GEMM of `ty` reads the activation rows rather than the
/// panels (the AVX-512 VNNI K-quant kernel), so that callers need not pack
/// them.
pub fn gemm_reads_rows(ty: crate::quant::GgmlType) -> bool {
    use crate::quant::GgmlType as T;
    // The i-quants' and ternary GEMMs read the rows on every CPU (the
    // AVX-512 kernel or the tiles).
    matches!(ty, T::Q4K | T::Q6K) && kgemm::avx512_enabled()
        || matches!(
            ty,
            T::IQ4XS | T::IQ3S | T::IQ3XXS | T::IQ2S | T::IQ2XS | T::IQ2XXS | T::TQ2_0 | T::TQ1_0
        )
}

/// A single-panel K-quant GEMM run over each group of a multi-panel call
/// (see `quant::GemmFn`).
fn k_groups(
    single: crate::quant::GemmFn,
    (n, w_rows, acts): (usize, &[&[u8]], &[&[u8]]),
    quants: &[u8],
    scales: &[f32],
    out: &mut [f32],
) {
    use crate::quant::panel::{KPANEL_BLOCK, KPANEL_SCALES};
    use crate::quant::GEMM_COLS;
    let nb = n / super::QK_K;
    let (qb, sb, ob) = (
        nb * KPANEL_BLOCK,
        nb * KPANEL_SCALES,
        w_rows.len() * GEMM_COLS,
    );
    for (g, group) in acts.chunks(GEMM_COLS).enumerate() {
        let (q, s) = (&quants[g * qb..(g + 1) * qb], &scales[g * sb..(g + 1) * sb]);
        single(n, w_rows, group, q, s, &mut out[g * ob..(g + 1) * ob]);
    }
}

/// Q4_K's GEMM over any number of panels: the AVX-512 VNNI kernel (which
/// reads the activation rows) where the CPU has it (same bits), else the
/// AVX2 kernel panel by panel.
pub fn gemm_q4_k(n: usize, w: &[&[u8]], a: &[&[u8]], q: &[u8], s: &[f32], o: &mut [f32]) {
    if kgemm::avx512_enabled() {
        return kgemm::gemm_q4_k_avx512(n, w, a, o);
    }
    k_groups(kgemm::gemm_q4_k, (n, w, a), q, s, o)
}

/// Q6_K's GEMM over any number of panels.
pub fn gemm_q6_k(n: usize, w: &[&[u8]], a: &[&[u8]], q: &[u8], s: &[f32], o: &mut [f32]) {
    if kgemm::avx512_enabled() {
        return kgemm::gemm_q6_k_avx512(n, w, a, o);
    }
    k_groups(kgemm::gemm_q6_k, (n, w, a), q, s, o)
}

/// The GEMM of a `Block32` format: the AVX-512 VNNI twin where the CPU
/// has it (same bits), else the AVX2 kernel.
fn gemm_block32<F: Block32>(
    n: usize,
    w_rows: &[&[u8]],
    acts: &[&[u8]],
    quants: &[u8],
    scales: &[f32],
    out: &mut [f32],
) {
    let groups = acts.len().div_ceil(crate::quant::GEMM_COLS).max(1);
    if vnni() {
        gemm_vnni::gemm::<F>(n, w_rows, quants, scales, groups, out)
    } else {
        gemm::gemm::<F>(n, w_rows, quants, scales, groups, out)
    }
}

/// `$twins!(format)` for a 32-element format type, `None` for the rest:
/// the one list of those formats the twin tables below share.
#[cfg(test)]
macro_rules! by_block32 {
    ($ty:expr, $twins:ident) => {{
        use crate::quant::GgmlType as T;
        match $ty {
            T::Q4_0 => $twins!(q4_0::Q4_0),
            T::Q4_1 => $twins!(q4_1::Q4_1),
            T::Q5_0 => $twins!(q5_0::Q5_0),
            T::Q5_1 => $twins!(q5_1::Q5_1),
            T::Q8_0 => $twins!(q8_0::Q8_0),
            T::IQ4NL => $twins!(iq4_nl::Iq4Nl),
            T::MXFP4 => $twins!(mxfp4::Mxfp4),
            _ => None,
        }
    }};
}

/// The AVX2 and the AVX-512 VNNI tile of each 32-element format (the
/// latter `None` on a CPU without it), for the twin tests.
#[cfg(test)]
pub fn block32_tile_twins(
    ty: crate::quant::GgmlType,
) -> Option<(crate::quant::TileFn, Option<crate::quant::TileFn>)> {
    macro_rules! twins {
        ($f:ty) => {{
            fn avx2(n: usize, w: &[&[u8]], a: &[&[u8]], o: &mut [f32]) {
                tile32::<$f>(n, w, a, o)
            }
            fn vnni(n: usize, w: &[&[u8]], a: &[&[u8]], o: &mut [f32]) {
                rows16_vnni::tile::<$f>(n, w, a, o)
            }
            let v: crate::quant::TileFn = vnni;
            Some((
                avx2 as crate::quant::TileFn,
                rows16_vnni::available().then_some(v),
            ))
        }};
    }
    by_block32!(ty, twins)
}

/// The AVX2 and the AVX-512 VNNI GEMM of each 32-element format (the
/// latter `None` on a CPU without it), for the twin tests.
#[cfg(test)]
pub fn block32_gemm_twins(
    ty: crate::quant::GgmlType,
) -> Option<(crate::quant::GemmFn, Option<crate::quant::GemmFn>)> {
    macro_rules! twins {
        ($f:ty) => {{
            fn avx2(n: usize, w: &[&[u8]], a: &[&[u8]], q: &[u8], s: &[f32], o: &mut [f32]) {
                gemm::gemm::<$f>(n, w, q, s, a.len().div_ceil(8).max(1), o)
            }
            fn vnni(n: usize, w: &[&[u8]], a: &[&[u8]], q: &[u8], s: &[f32], o: &mut [f32]) {
                gemm_vnni::gemm::<$f>(n, w, q, s, a.len().div_ceil(8).max(1), o)
            }
            let v: crate::quant::GemmFn = vnni;
            Some((
                avx2 as crate::quant::GemmFn,
                gemm_vnni::available().then_some(v),
            ))
        }};
    }
    by_block32!(ty, twins)
}

/// The AVX2 and the AVX-512 VNNI GEMM of Q4_K and Q6_K (the latter `None`
/// on a CPU without it), for the twin tests; `None` for other formats.
#[cfg(test)]
pub fn kquant_gemm_twins(
    ty: crate::quant::GgmlType,
) -> Option<(crate::quant::GemmFn, Option<crate::quant::GemmFn>)> {
    use crate::quant::GgmlType as T;
    fn q4(n: usize, w: &[&[u8]], a: &[&[u8]], q: &[u8], s: &[f32], o: &mut [f32]) {
        k_groups(kgemm::gemm_q4_k, (n, w, a), q, s, o)
    }
    fn q6(n: usize, w: &[&[u8]], a: &[&[u8]], q: &[u8], s: &[f32], o: &mut [f32]) {
        k_groups(kgemm::gemm_q6_k, (n, w, a), q, s, o)
    }
    fn q4_512(n: usize, w: &[&[u8]], a: &[&[u8]], _: &[u8], _: &[f32], o: &mut [f32]) {
        kgemm::gemm_q4_k_avx512(n, w, a, o)
    }
    fn q6_512(n: usize, w: &[&[u8]], a: &[&[u8]], _: &[u8], _: &[f32], o: &mut [f32]) {
        kgemm::gemm_q6_k_avx512(n, w, a, o)
    }
    let wide = kgemm::avx512_available();
    match ty {
        T::Q4K => Some((q4, wide.then_some(q4_512 as crate::quant::GemmFn))),
        T::Q6K => Some((q6, wide.then_some(q6_512 as crate::quant::GemmFn))),
        _ => None,
    }
}

/// Declares `vec_dot_*` and `tile_*` for a `Block32` format.
macro_rules! block32_entries {
    ($vec_dot:ident, $tile:ident, $gemm:ident, $fmt:ty) => {
        pub fn $vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
            super::dot32::<$fmt>(n, w, a)
        }

        pub fn $tile(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]) {
            super::tile_block32::<$fmt>(n, w_rows, acts, out)
        }

        pub fn $gemm(
            n: usize,
            w_rows: &[&[u8]],
            acts: &[&[u8]],
            quants: &[u8],
            scales: &[f32],
            out: &mut [f32],
        ) {
            super::gemm_block32::<$fmt>(n, w_rows, acts, quants, scales, out)
        }
    };
}
use block32_entries;
