//! The i-quants and ternary formats x Q8_K: each super-block is decoded
//! once into eight 32-byte runs of signed values and sixteen i8 group
//! scales, then met by up to KCOLS activation rows with `maddubs`
//! (magnitudes against sign-moved activations) and `madd` by the scales.
//! The block integer is exactly the scalar reference's (`iq_common`), and
//! it becomes a float in the same order, so these kernels give the scalar
//! kernels' bits and a token's logits do not depend on its batch.

use std::arch::x86_64::*;

use super::{bit_bytes, hsum_i32, load, read_f32, read_u32, scale_pair};
use crate::quant::iq_common::{ksigns, Decoded, KVALUES_IQ4NL};
use crate::quant::iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use crate::quant::{block, iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs, iq4_xs};
use crate::quant::{q8_k, tq1_0, tq2_0, QK_K};

/// A Q8_K-partnered format as the kernels below (and the AVX-512 GEMM,
/// `kgemm`) see it.
pub(super) trait IqFormat {
    const BLOCK: usize;
    /// The power of two ggml multiplies the row's sum by, applied to the
    /// block scale as the scalar reference does (`iq_common::dot_rows`).
    const FACTOR: f32 = 1.0;
    /// Whether the block's value is `(d * d_a) * isum` (the GEMM's form);
    /// IQ1_S and IQ1_M add a shift term.
    const PLAIN: bool = true;
    /// The block's eight runs of signed values and its sixteen group scales.
    unsafe fn decode(bw: *const u8) -> ([__m256i; 8], __m128i);
    /// The block scale times `FACTOR`.
    unsafe fn d(bw: *const u8) -> f32 {
        // SAFETY: every plain format here but the ternary ones has its f16
        // scale first (they override this).
        unsafe { super::f16_at(bw) * Self::FACTOR }
    }
    /// The block's value from its exact integer, as the scalar reference
    /// forms it: `(d * d_a) * isum` unless the format adds a shift.
    unsafe fn value(bw: *const u8, ba: *const u8, isum: i32) -> f32 {
        // SAFETY: a whole block; a Q8_K block starts with its f32 scale.
        unsafe { (Self::d(bw) * read_f32(ba)) * isum as f32 }
    }
}

/// The values `Decoded` holds, as registers (for the formats whose decode
/// stays scalar).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn from_decoded(dec: &Decoded) -> ([__m256i; 8], __m128i) {
    // SAFETY: `q` holds 256 bytes.
    let runs = std::array::from_fn(|ib| unsafe { load(dec.q.as_ptr().add(32 * ib) as *const u8) });
    let sc: [i8; 16] = std::array::from_fn(|g| dec.scales[g] as i8);
    // SAFETY: 16 bytes.
    (runs, unsafe { super::load128(sc.as_ptr() as *const u8) })
}

/// Signed values from magnitudes and the bits that mark negatives.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn with_signs(mags: __m256i, neg_bits: u32) -> __m256i {
    _mm256_sign_epi8(
        mags,
        _mm256_or_si256(bit_bytes(neg_bits), _mm256_set1_epi8(1)),
    )
}

/// The four 7-bit sign fields of `w` expanded by `ksigns` into 32 bits.
#[inline]
fn sign_word(w: u32) -> u32 {
    (0..4).fold(0u32, |acc, l| {
        acc | (KSIGNS[((w >> (7 * l)) & 127) as usize] as u32) << (8 * l)
    })
}

static KSIGNS: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = ksigns(i);
        i += 1;
    }
    t
};

#[inline]
fn row8(r: &[u8; 8]) -> i64 {
    u64::from_le_bytes(*r) as i64
}

#[inline]
fn row4(r: &[u8; 4]) -> i32 {
    u32::from_le_bytes(*r) as i32
}

/// Sixteen i8 scales with each sub-block's value in both of its groups.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scales32(s: [i8; 8]) -> __m128i {
    let w = u64::from_le_bytes(s.map(|v| v as u8)) as i64;
    _mm_unpacklo_epi8(_mm_cvtsi64_si128(w), _mm_cvtsi64_si128(w))
}

pub(super) struct Iq2xxs;
impl IqFormat for Iq2xxs {
    const BLOCK: usize = iq2_xxs::BLOCK;
    const FACTOR: f32 = 0.125;
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn decode(bw: *const u8) -> ([__m256i; 8], __m128i) {
        let mut sc = [0i8; 8];
        let runs = std::array::from_fn(|ib| {
            // SAFETY: two words per sub-block from byte 2 of a 66-byte block.
            let (w0, w1) = unsafe { (read_u32(bw.add(2 + 8 * ib)), read_u32(bw.add(6 + 8 * ib))) };
            sc[ib] = (2 * (w1 >> 28) + 1) as i8;
            let g = |l: u32| row8(&IQ2XXS_GRID[((w0 >> (8 * l)) & 0xff) as usize]);
            with_signs(_mm256_set_epi64x(g(3), g(2), g(1), g(0)), sign_word(w1))
        });
        (runs, scales32(sc))
    }
}

pub(super) struct Iq2xs;
impl IqFormat for Iq2xs {
    const BLOCK: usize = iq2_xs::BLOCK;
    const FACTOR: f32 = 0.125;
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn decode(bw: *const u8) -> ([__m256i; 8], __m128i) {
        let runs = std::array::from_fn(|ib| {
            // SAFETY: 32 u16 words from byte 2 of a 74-byte block.
            let w = |l: usize| unsafe {
                u16::from_le_bytes([*bw.add(2 + 8 * ib + 2 * l), *bw.add(3 + 8 * ib + 2 * l)])
                    as usize
            };
            let ws = [w(0), w(1), w(2), w(3)];
            let g = |l: usize| row8(&IQ2XS_GRID[ws[l] & 511]);
            let bits = (0..4).fold(0u32, |a, l| a | (KSIGNS[ws[l] >> 9] as u32) << (8 * l));
            with_signs(_mm256_set_epi64x(g(3), g(2), g(1), g(0)), bits)
        });
        (runs, scales_nibbles(bw.wrapping_add(66)))
    }
}

/// Eight bytes of two 4-bit scales `s` each, as sixteen `2s + 1`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scales_nibbles(p: *const u8) -> __m128i {
    // SAFETY: callers pass a pointer to 8 readable bytes.
    let raw = _mm_cvtsi64_si128(unsafe { (p as *const i64).read_unaligned() });
    let m = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(raw, m);
    let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m);
    let s = _mm_unpacklo_epi8(lo, hi);
    _mm_add_epi8(_mm_add_epi8(s, s), _mm_set1_epi8(1))
}

pub(super) struct Iq2s;
impl IqFormat for Iq2s {
    const BLOCK: usize = iq2_s::BLOCK;
    const FACTOR: f32 = 0.125;
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn decode(bw: *const u8) -> ([__m256i; 8], __m128i) {
        let runs = std::array::from_fn(|ib| {
            // SAFETY: indices at 2..34, signs at 34..66, high bits at 66..74.
            let (qh, signs) = unsafe { (*bw.add(66 + ib) as usize, read_u32(bw.add(34 + 4 * ib))) };
            let g = |l: usize| {
                // SAFETY: as above.
                let lo = unsafe { *bw.add(2 + 4 * ib + l) } as usize;
                row8(&IQ2S_GRID[lo | ((qh << (8 - 2 * l)) & 0x300)])
            };
            with_signs(_mm256_set_epi64x(g(3), g(2), g(1), g(0)), signs)
        });
        (runs, scales_nibbles(bw.wrapping_add(74)))
    }
}

pub(super) struct Iq3xxs;
impl IqFormat for Iq3xxs {
    const BLOCK: usize = iq3_xxs::BLOCK;
    const FACTOR: f32 = 0.25;
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn decode(bw: *const u8) -> ([__m256i; 8], __m128i) {
        let mut sc = [0i8; 8];
        let runs = std::array::from_fn(|ib| {
            // SAFETY: 64 indices at 2..66, a word per sub-block at 66..98.
            let w = unsafe { read_u32(bw.add(66 + 4 * ib)) };
            sc[ib] = (2 * (w >> 28) + 1) as i8;
            // SAFETY: as above.
            let g = |k: usize| row4(&IQ3XXS_GRID[unsafe { *bw.add(2 + 8 * ib + k) } as usize]);
            let mags = _mm256_set_epi32(g(7), g(6), g(5), g(4), g(3), g(2), g(1), g(0));
            with_signs(mags, sign_word(w))
        });
        (runs, scales32(sc))
    }
}

pub(super) struct Iq3s;
impl IqFormat for Iq3s {
    const BLOCK: usize = iq3_s::BLOCK;
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn decode(bw: *const u8) -> ([__m256i; 8], __m128i) {
        let mut sc = [0i8; 8];
        let runs = std::array::from_fn(|ib| {
            // SAFETY: indices 2..66, high bits 66..74, signs 74..106, scales 106..110.
            let (qh, signs, s) = unsafe {
                (
                    *bw.add(66 + ib) as usize,
                    read_u32(bw.add(74 + 4 * ib)),
                    *bw.add(106 + ib / 2),
                )
            };
            sc[ib] = (2 * ((s >> (4 * (ib % 2))) & 0x0f) + 1) as i8;
            let g = |k: usize| {
                // SAFETY: as above.
                let lo = unsafe { *bw.add(2 + 8 * ib + k) } as usize;
                row4(&IQ3S_GRID[lo | ((qh << (8 - k)) & 256)])
            };
            let mags = _mm256_set_epi32(g(7), g(6), g(5), g(4), g(3), g(2), g(1), g(0));
            with_signs(mags, signs)
        });
        (runs, scales32(sc))
    }
}

pub(super) struct Iq4xs;
impl IqFormat for Iq4xs {
    const BLOCK: usize = iq4_xs::BLOCK;
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn decode(bw: *const u8) -> ([__m256i; 8], __m128i) {
        // SAFETY: the table is 16 bytes.
        let kv = unsafe { super::load128(KVALUES_IQ4NL.as_ptr() as *const u8) };
        let table = _mm256_set_m128i(kv, kv);
        // SAFETY: the block's scales are its bytes 2..8, its values 8..136.
        let b = unsafe { std::slice::from_raw_parts(bw, iq4_xs::BLOCK) };
        let sc: [i8; 8] = std::array::from_fn(|ib| iq4_xs::scale(b, ib) as i8);
        let runs = std::array::from_fn(|ib| {
            // SAFETY: as above.
            _mm256_shuffle_epi8(table, unsafe { super::nibbles(bw.add(8 + 16 * ib)) })
        });
        (runs, scales32(sc))
    }
}

pub(super) struct Tq2;
impl IqFormat for Tq2 {
    const BLOCK: usize = tq2_0::BLOCK;
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn decode(bw: *const u8) -> ([__m256i; 8], __m128i) {
        // SAFETY: 64 bytes of 2-bit values.
        let halves = unsafe { [load(bw), load(bw.add(32))] };
        let (three, one) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1));
        let runs = std::array::from_fn(|ib| {
            let v = match ib % 4 {
                0 => halves[ib / 4],
                1 => _mm256_srli_epi16(halves[ib / 4], 2),
                2 => _mm256_srli_epi16(halves[ib / 4], 4),
                _ => _mm256_srli_epi16(halves[ib / 4], 6),
            };
            _mm256_sub_epi8(_mm256_and_si256(v, three), one)
        });
        (runs, _mm_set1_epi8(1))
    }
    unsafe fn d(bw: *const u8) -> f32 {
        // SAFETY: the f16 scale follows the 64 value bytes.
        unsafe { super::f16_at(bw.add(64)) }
    }
}

/// A format decoded by its scalar reference into registers.
macro_rules! scalar_decoded {
    ($name:ident, $module:ident) => {
        pub(super) struct $name;
        impl $name {
            #[inline]
            #[target_feature(enable = "avx2")]
            unsafe fn decoded(bw: *const u8) -> ([__m256i; 8], __m128i) {
                let mut dec = Decoded::new();
                // SAFETY: the caller passes a whole block.
                $module::decode(
                    unsafe { std::slice::from_raw_parts(bw, $module::BLOCK) },
                    &mut dec,
                );
                // SAFETY: AVX2 is enabled here.
                unsafe { from_decoded(&dec) }
            }
        }
    };
}

scalar_decoded!(Tq1, tq1_0);
impl IqFormat for Tq1 {
    const BLOCK: usize = tq1_0::BLOCK;
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn decode(bw: *const u8) -> ([__m256i; 8], __m128i) {
        // SAFETY: as the trait's contract.
        unsafe { Self::decoded(bw) }
    }
    unsafe fn d(bw: *const u8) -> f32 {
        // SAFETY: the f16 scale follows the 52 trit bytes.
        unsafe { super::f16_at(bw.add(52)) }
    }
}

scalar_decoded!(Iq1s, iq1_s);
impl IqFormat for Iq1s {
    const BLOCK: usize = iq1_s::BLOCK;
    const PLAIN: bool = false;
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn decode(bw: *const u8) -> ([__m256i; 8], __m128i) {
        // SAFETY: as the trait's contract.
        unsafe { Self::decoded(bw) }
    }
    unsafe fn value(bw: *const u8, ba: *const u8, isum: i32) -> f32 {
        // SAFETY: whole blocks on both sides.
        let (b, a) = unsafe {
            (
                std::slice::from_raw_parts(bw, iq1_s::BLOCK),
                std::slice::from_raw_parts(ba, q8_k::BLOCK),
            )
        };
        let d = block::f16_at(b, 0) * block::f32_at(a, 0);
        d * (isum as f32 + iq1_s::DELTA * iq1_s::shift_sum(b, a) as f32)
    }
}

scalar_decoded!(Iq1m, iq1_m);
impl IqFormat for Iq1m {
    const BLOCK: usize = iq1_m::BLOCK;
    const PLAIN: bool = false;
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn decode(bw: *const u8) -> ([__m256i; 8], __m128i) {
        // SAFETY: as the trait's contract.
        unsafe { Self::decoded(bw) }
    }
    unsafe fn value(bw: *const u8, ba: *const u8, isum: i32) -> f32 {
        // SAFETY: whole blocks on both sides.
        let (b, a) = unsafe {
            (
                std::slice::from_raw_parts(bw, iq1_m::BLOCK),
                std::slice::from_raw_parts(ba, q8_k::BLOCK),
            )
        };
        let d = iq1_m::scale(b) * block::f32_at(a, 0);
        d * (isum as f32 + iq1_m::DELTA * iq1_m::shift_sum(b, a) as f32)
    }
}

/// One weight row of `nb` blocks against C activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot<F: IqFormat, const C: usize>(nb: usize, w: *const u8, a: [*const u8; C]) -> [f32; C] {
    let mut acc = [0f32; C];
    for i in 0..nb {
        // SAFETY: the caller guarantees nb whole blocks on every row.
        let bw = unsafe { w.add(i * F::BLOCK) };
        crate::simd::prefetch_bytes(bw.wrapping_add(nb * F::BLOCK), F::BLOCK);
        // SAFETY: a whole block.
        let (runs, scales8) = unsafe { F::decode(bw) };
        let mut sumi = [_mm256_setzero_si256(); C];
        for (ib, &v) in runs.iter().enumerate() {
            let mags = _mm256_sign_epi8(v, v);
            let sc = scale_pair(scales8, ib);
            for c in 0..C {
                // SAFETY: a Q8_K block has 256 quants from offset 4.
                let x = unsafe { load(a[c].add(i * q8_k::BLOCK + 4 + 32 * ib)) };
                let p = _mm256_maddubs_epi16(mags, _mm256_sign_epi8(x, v));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p, sc));
            }
        }
        for c in 0..C {
            // SAFETY: whole blocks on both sides.
            acc[c] += unsafe { F::value(bw, a[c].add(i * q8_k::BLOCK), hsum_i32(sumi[c])) };
        }
    }
    acc
}

/// `GemmFn`'s layout through the tile kernels, for CPUs without the
/// AVX-512 GEMM (and the IQ1 formats): `out[(g * rows + r) * 8 + c]` for
/// token `8g + c`, the padding columns zero. Same bits as `vec_dot`.
fn gemm_by_tiles<F: IqFormat>(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]) {
    use crate::quant::GEMM_COLS;
    let rows = w_rows.len();
    let mut tile = vec![0f32; rows * GEMM_COLS];
    for (g, group) in acts.chunks(GEMM_COLS).enumerate() {
        let nc = group.len();
        super::tile_k(
            n,
            F::BLOCK,
            w_rows,
            group,
            &mut tile[..rows * nc],
            (dot::<F, { super::KCOLS }>, dot::<F, 2>, dot::<F, 1>),
        );
        let o = &mut out[g * rows * GEMM_COLS..(g + 1) * rows * GEMM_COLS];
        for r in 0..rows {
            for c in 0..GEMM_COLS {
                o[r * GEMM_COLS + c] = if c < nc { tile[r * nc + c] } else { 0.0 };
            }
        }
    }
}

macro_rules! entries {
    ($fmt:ty, $vec_dot:ident, $tile:ident, $gemm:ident) => {
        entries!($fmt, $vec_dot, $tile);

        /// Rows against activation rows in `GemmFn`'s layout (the panels
        /// are not read): the AVX-512 VNNI GEMM where it runs, else the
        /// tiles. Same bits either way.
        pub fn $gemm(
            n: usize,
            w_rows: &[&[u8]],
            acts: &[&[u8]],
            _quants: &[u8],
            _scales: &[f32],
            out: &mut [f32],
        ) {
            if super::kgemm::avx512_enabled() {
                super::kgemm::gemm_iq_avx512::<$fmt>(n, w_rows, acts, out)
            } else {
                gemm_by_tiles::<$fmt>(n, w_rows, acts, out)
            }
        }
    };
    ($fmt:ty, $vec_dot:ident, $tile:ident) => {
        pub fn $vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = n / QK_K;
            assert!(
                w.len() >= nb * <$fmt>::BLOCK && a.len() >= nb * q8_k::BLOCK,
                "row too short"
            );
            // SAFETY: features detected at install time; the assert bounds all blocks.
            unsafe { dot::<$fmt, 1>(nb, w.as_ptr(), [a.as_ptr()])[0] }
        }

        pub fn $tile(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]) {
            super::tile_k(
                n,
                <$fmt>::BLOCK,
                w_rows,
                acts,
                out,
                (
                    dot::<$fmt, { super::KCOLS }>,
                    dot::<$fmt, 2>,
                    dot::<$fmt, 1>,
                ),
            )
        }
    };
}

entries!(Iq2xxs, vec_dot_iq2_xxs, tile_iq2_xxs, gemm_iq2_xxs);
entries!(Iq2xs, vec_dot_iq2_xs, tile_iq2_xs, gemm_iq2_xs);
entries!(Iq2s, vec_dot_iq2_s, tile_iq2_s, gemm_iq2_s);
entries!(Iq3xxs, vec_dot_iq3_xxs, tile_iq3_xxs, gemm_iq3_xxs);
entries!(Iq3s, vec_dot_iq3_s, tile_iq3_s, gemm_iq3_s);
entries!(Iq4xs, vec_dot_iq4_xs, tile_iq4_xs, gemm_iq4_xs);
entries!(Tq2, vec_dot_tq2_0, tile_tq2_0, gemm_tq2_0);
entries!(Tq1, vec_dot_tq1_0, tile_tq1_0, gemm_tq1_0);
entries!(Iq1s, vec_dot_iq1_s, tile_iq1_s);
entries!(Iq1m, vec_dot_iq1_m, tile_iq1_m);
