//! The i-quants and ternary formats x Q8_K: each super-block is decoded
//! once into eight 32-byte runs of signed values and sixteen i8 group
//! scales, then met by up to KCOLS activation rows with `maddubs`
//! (magnitudes against sign-moved activations) and `madd` by the scales.
//! The block integer is exactly the scalar reference's (`iq_common`), and
//! it becomes a float in the same order, so these kernels give the scalar
//! kernels' bits and a token's logits do not depend on its batch.

use std::arch::x86_64::*;

use super::kgemm::{KFormat, CORR, SCALES};
use super::{bit_bytes, hsum_i32, load, read_f32, read_u32, scale_pair};
use crate::quant::iq_common::{ksigns, Decoded, KVALUES_IQ4NL};
use crate::quant::iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use crate::quant::{iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs, iq4_xs};
use crate::quant::{q8_k, tq1_0, tq2_0, QK_K};

/// A Q8_K-partnered format as the kernels below (and the AVX-512 GEMM,
/// `kgemm`) see it: a block is opened once, then read run by run (32
/// elements), so the kernels keep only the run at hand in registers.
pub(super) trait IqFormat {
    const BLOCK: usize;
    /// The power of two ggml multiplies the row's sum by, applied to the
    /// block scale as the scalar reference does (`iq_common::dot_rows`).
    const FACTOR: f32 = 1.0;
    /// Whether the block's value is `(d * d_a) * isum` (the GEMM's form);
    /// IQ1_S and IQ1_M add a shift term.
    const PLAIN: bool = true;
    /// One scale per 32 elements (`scales8` gives each twice), which the
    /// AVX-512 GEMM applies once per run rather than once per sixteen.
    const SCALE32: bool = true;
    /// What a block needs decoded before its runs are read.
    type Open;
    /// Opens the block at `bw`.
    unsafe fn open(bw: *const u8) -> Self::Open;
    /// Run `ib` (elements `32 ib ..`) as unsigned magnitudes and a vector
    /// whose byte signs are the values' (`sign_epi8`'s second operand:
    /// negative, positive, or zero where the magnitude is zero).
    unsafe fn run(o: &Self::Open, bw: *const u8, ib: usize) -> (__m256i, __m256i);
    /// The sixteen i8 group scales.
    unsafe fn scales8(o: &Self::Open, bw: *const u8) -> __m128i;
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

/// Signed values as a (magnitude, sign) run.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn split(v: __m256i) -> (__m256i, __m256i) {
    (_mm256_sign_epi8(v, v), v)
}

/// ggml's `ksigns` as eight bytes each: -1 where the sign bit is set,
/// else 1 (what `sign_epi8` applies).
static KSIGNS64: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let ks = ksigns(i);
        let mut j = 0;
        while j < 8 {
            let byte: u64 = if (ks >> j) & 1 != 0 { 0xff } else { 0x01 };
            t[i] |= byte << (8 * j);
            j += 1;
        }
        i += 1;
    }
    t
};

/// The signs of four groups of eight from the 7-bit `ksigns` fields of
/// `w` (bits `7l..7l + 7` for group `l`).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn ksign_run(w: u32) -> __m256i {
    let k = |l: u32| KSIGNS64[((w >> (7 * l)) & 127) as usize] as i64;
    _mm256_set_epi64x(k(3), k(2), k(1), k(0))
}

/// Signs from 32 stored bits (set: negative).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bit_signs(bits: u32) -> __m256i {
    _mm256_or_si256(bit_bytes(bits), _mm256_set1_epi8(1))
}

/// Four rows of an 8-byte grid. Scalar loads and inserts: measured faster
/// than `vpgatherqq` here (IQ2_XXS 4.2 against 6.0 us for sixteen rows of
/// 2048 on Zen 4).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn rows8(grid: &[[u8; 8]], idx: [usize; 4]) -> __m256i {
    let g = |l: usize| u64::from_le_bytes(grid[idx[l]]) as i64;
    _mm256_set_epi64x(g(3), g(2), g(1), g(0))
}

/// Eight rows of a 4-byte grid, gathered: for eight rows a gather beat
/// the loads and inserts (IQ3_S 5.4 against 10.9 us, as `rows8` measures).
///
/// # Safety
/// Every lane of `idx` is below the grid's length.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn rows4(grid: &[[u8; 4]], idx: __m256i) -> __m256i {
    // SAFETY: the caller's contract bounds every index.
    unsafe { _mm256_i32gather_epi32::<4>(grid.as_ptr() as *const i32, idx) }
}

/// Sixteen i8 scales with each sub-block's value in both of its groups.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scales32(s: [i8; 8]) -> __m128i {
    let w = u64::from_le_bytes(s.map(|v| v as u8)) as i64;
    _mm_unpacklo_epi8(_mm_cvtsi64_si128(w), _mm_cvtsi64_si128(w))
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

/// The scale field in the top four bits of each sub-block's sign word
/// (IQ2_XXS at bytes 6 + 8ib, IQ3_XXS at 66 + 4ib), as `2s + 1`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn top_nibble_scales(bw: *const u8, first: usize, stride: usize) -> __m128i {
    // SAFETY: callers pass a block holding eight words from `first`.
    let sc: [i8; 8] = std::array::from_fn(|ib| {
        (2 * (unsafe { read_u32(bw.add(first + stride * ib)) } >> 28) + 1) as i8
    });
    unsafe { scales32(sc) }
}

pub(super) struct Iq2xxs;
impl IqFormat for Iq2xxs {
    const BLOCK: usize = iq2_xxs::BLOCK;
    const FACTOR: f32 = 0.125;
    type Open = ();
    #[inline]
    unsafe fn open(_: *const u8) {}
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn run(_: &(), bw: *const u8, ib: usize) -> (__m256i, __m256i) {
        // SAFETY: two words per sub-block from byte 2 of a 66-byte block.
        let (w0, w1) = unsafe { (read_u32(bw.add(2 + 8 * ib)), read_u32(bw.add(6 + 8 * ib))) };
        let idx = std::array::from_fn(|l| ((w0 >> (8 * l)) & 0xff) as usize);
        (rows8(&IQ2XXS_GRID, idx), ksign_run(w1))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn scales8(_: &(), bw: *const u8) -> __m128i {
        // SAFETY: the sign words at 6 + 8ib.
        unsafe { top_nibble_scales(bw, 6, 8) }
    }
}

pub(super) struct Iq2xs;
impl IqFormat for Iq2xs {
    const BLOCK: usize = iq2_xs::BLOCK;
    const SCALE32: bool = false;
    const FACTOR: f32 = 0.125;
    type Open = ();
    #[inline]
    unsafe fn open(_: *const u8) {}
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn run(_: &(), bw: *const u8, ib: usize) -> (__m256i, __m256i) {
        // SAFETY: 32 u16 words from byte 2 of a 74-byte block: four per
        // sub-block, 9 bits of index and 7 of signs each.
        let w: [usize; 4] = std::array::from_fn(|l| unsafe {
            u16::from_le_bytes([*bw.add(2 + 8 * ib + 2 * l), *bw.add(3 + 8 * ib + 2 * l)]) as usize
        });
        let signs = (0..4).fold(0u32, |a, l| a | ((w[l] >> 9) as u32) << (7 * l));
        (rows8(&IQ2XS_GRID, w.map(|v| v & 511)), ksign_run(signs))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn scales8(_: &(), bw: *const u8) -> __m128i {
        // SAFETY: the scale bytes at 66..74.
        unsafe { scales_nibbles(bw.add(66)) }
    }
}

pub(super) struct Iq2s;
impl IqFormat for Iq2s {
    const BLOCK: usize = iq2_s::BLOCK;
    const SCALE32: bool = false;
    const FACTOR: f32 = 0.125;
    type Open = ();
    #[inline]
    unsafe fn open(_: *const u8) {}
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn run(_: &(), bw: *const u8, ib: usize) -> (__m256i, __m256i) {
        // SAFETY: indices at 2..34, signs at 34..66, high bits at 66..74.
        let (lo, qh, signs) = unsafe {
            (
                read_u32(bw.add(2 + 4 * ib)),
                *bw.add(66 + ib) as usize,
                read_u32(bw.add(34 + 4 * ib)),
            )
        };
        let idx = std::array::from_fn(|l| {
            ((lo >> (8 * l)) & 0xff) as usize | ((qh << (8 - 2 * l)) & 0x300)
        });
        (rows8(&IQ2S_GRID, idx), bit_signs(signs))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn scales8(_: &(), bw: *const u8) -> __m128i {
        // SAFETY: the scale bytes at 74..82.
        unsafe { scales_nibbles(bw.add(74)) }
    }
}

pub(super) struct Iq3xxs;
impl IqFormat for Iq3xxs {
    const BLOCK: usize = iq3_xxs::BLOCK;
    const FACTOR: f32 = 0.25;
    type Open = ();
    #[inline]
    unsafe fn open(_: *const u8) {}
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn run(_: &(), bw: *const u8, ib: usize) -> (__m256i, __m256i) {
        // SAFETY: 64 indices at 2..66, a word per sub-block at 66..98.
        let (w, q) = unsafe {
            (
                read_u32(bw.add(66 + 4 * ib)),
                _mm_loadl_epi64(bw.add(2 + 8 * ib) as *const __m128i),
            )
        };
        // SAFETY: byte indices, below the grid's 256 rows.
        (
            unsafe { rows4(&IQ3XXS_GRID, _mm256_cvtepu8_epi32(q)) },
            ksign_run(w),
        )
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn scales8(_: &(), bw: *const u8) -> __m128i {
        // SAFETY: the words at 66 + 4ib.
        unsafe { top_nibble_scales(bw, 66, 4) }
    }
}

pub(super) struct Iq3s;
impl IqFormat for Iq3s {
    const BLOCK: usize = iq3_s::BLOCK;
    type Open = ();
    #[inline]
    unsafe fn open(_: *const u8) {}
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn run(_: &(), bw: *const u8, ib: usize) -> (__m256i, __m256i) {
        // Index k of a sub-block: its low byte and bit k of the sub-block's
        // high byte as bit 8.
        let shifts = _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1);
        // SAFETY: indices 2..66, high bits 66..74, signs 74..106.
        let (q, qh, signs) = unsafe {
            (
                _mm_loadl_epi64(bw.add(2 + 8 * ib) as *const __m128i),
                *bw.add(66 + ib) as i32,
                read_u32(bw.add(74 + 4 * ib)),
            )
        };
        let hi = _mm256_and_si256(
            _mm256_sllv_epi32(_mm256_set1_epi32(qh), shifts),
            _mm256_set1_epi32(256),
        );
        let idx = _mm256_or_si256(_mm256_cvtepu8_epi32(q), hi);
        // SAFETY: a byte and bit 8: below the grid's 512 rows.
        (unsafe { rows4(&IQ3S_GRID, idx) }, bit_signs(signs))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn scales8(_: &(), bw: *const u8) -> __m128i {
        // SAFETY: the four scale bytes at 106..110.
        let raw = unsafe { read_u32(bw.add(106)) } as i32;
        let v = _mm_cvtsi32_si128(raw);
        let m = _mm_set1_epi8(0x0f);
        let s = _mm_unpacklo_epi8(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m));
        let s = _mm_add_epi8(_mm_add_epi8(s, s), _mm_set1_epi8(1));
        // Each sub-block's scale in both of its groups.
        _mm_unpacklo_epi8(s, s)
    }
}

pub(super) struct Iq4xs;
impl IqFormat for Iq4xs {
    const BLOCK: usize = iq4_xs::BLOCK;
    type Open = __m256i;
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn open(_: *const u8) -> __m256i {
        // SAFETY: the table is 16 bytes.
        let kv = unsafe { super::load128(KVALUES_IQ4NL.as_ptr() as *const u8) };
        _mm256_set_m128i(kv, kv)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn run(table: &__m256i, bw: *const u8, ib: usize) -> (__m256i, __m256i) {
        // SAFETY: the values at 8..136, 16 bytes a sub-block.
        split(_mm256_shuffle_epi8(*table, unsafe {
            super::nibbles(bw.add(8 + 16 * ib))
        }))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn scales8(_: &__m256i, bw: *const u8) -> __m128i {
        // SAFETY: the block's scales are its bytes 2..8.
        let b = unsafe { std::slice::from_raw_parts(bw, 8) };
        let h = u16::from_le_bytes([b[2], b[3]]) as i32;
        let sc: [i8; 8] = std::array::from_fn(|ib| {
            let lo = (b[4 + ib / 2] as i32 >> (4 * (ib % 2))) & 0x0f;
            ((lo | (((h >> (2 * ib)) & 3) << 4)) - 32) as i8
        });
        unsafe { scales32(sc) }
    }
}

pub(super) struct Tq2;
impl IqFormat for Tq2 {
    const BLOCK: usize = tq2_0::BLOCK;
    type Open = ();
    #[inline]
    unsafe fn open(_: *const u8) {}
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn run(_: &(), bw: *const u8, ib: usize) -> (__m256i, __m256i) {
        // SAFETY: 64 bytes of 2-bit values: run ib is bits 2(ib % 4) of
        // half ib / 4.
        let h = unsafe { load(bw.add(32 * (ib / 4))) };
        let v = _mm256_srlv_epi64(h, _mm256_set1_epi64x(2 * (ib % 4) as i64));
        split(_mm256_sub_epi8(
            _mm256_and_si256(v, _mm256_set1_epi8(3)),
            _mm256_set1_epi8(1),
        ))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn scales8(_: &(), _: *const u8) -> __m128i {
        _mm_set1_epi8(1)
    }
    unsafe fn d(bw: *const u8) -> f32 {
        // SAFETY: the f16 scale follows the 64 value bytes.
        unsafe { super::f16_at(bw.add(64)) }
    }
}

/// A format whose runs come from its scalar decode (`Decoded`).
macro_rules! scalar_decoded {
    ($name:ident, $module:ident) => {
        pub(super) struct $name;
        impl $name {
            #[inline]
            unsafe fn decoded(bw: *const u8) -> Decoded {
                let mut dec = Decoded::new();
                // SAFETY: the caller passes a whole block.
                $module::decode(
                    unsafe { std::slice::from_raw_parts(bw, $module::BLOCK) },
                    &mut dec,
                );
                dec
            }
            #[inline]
            #[target_feature(enable = "avx2")]
            unsafe fn run_of(dec: &Decoded, ib: usize) -> (__m256i, __m256i) {
                // SAFETY: `q` holds 256 bytes.
                split(unsafe { load(dec.q.as_ptr().add(32 * ib) as *const u8) })
            }
            #[inline]
            #[target_feature(enable = "avx2")]
            unsafe fn scales_of(dec: &Decoded) -> __m128i {
                let sc: [i8; 16] = std::array::from_fn(|g| dec.scales[g] as i8);
                // SAFETY: 16 bytes.
                unsafe { super::load128(sc.as_ptr() as *const u8) }
            }
        }
    };
}

/// The `Open`, `open`, `run` and `scales8` of a `scalar_decoded!` format.
macro_rules! decoded_runs {
    () => {
        type Open = Decoded;
        #[inline]
        unsafe fn open(bw: *const u8) -> Decoded {
            // SAFETY: as the trait's contract.
            unsafe { Self::decoded(bw) }
        }
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn run(o: &Decoded, _: *const u8, ib: usize) -> (__m256i, __m256i) {
            // SAFETY: AVX2 is enabled here.
            unsafe { Self::run_of(o, ib) }
        }
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn scales8(o: &Decoded, _: *const u8) -> __m128i {
            // SAFETY: AVX2 is enabled here.
            unsafe { Self::scales_of(o) }
        }
    };
}

scalar_decoded!(Tq1, tq1_0);
impl IqFormat for Tq1 {
    const BLOCK: usize = tq1_0::BLOCK;
    decoded_runs!();
    unsafe fn d(bw: *const u8) -> f32 {
        // SAFETY: the f16 scale follows the 52 trit bytes.
        unsafe { super::f16_at(bw.add(52)) }
    }
}

scalar_decoded!(Iq1s, iq1_s);
impl IqFormat for Iq1s {
    const BLOCK: usize = iq1_s::BLOCK;
    const SCALE32: bool = false;
    const PLAIN: bool = false;
    decoded_runs!();
    unsafe fn value(bw: *const u8, ba: *const u8, isum: i32) -> f32 {
        // SAFETY: whole blocks on both sides.
        let (b, a) = unsafe {
            (
                std::slice::from_raw_parts(bw, iq1_s::BLOCK),
                std::slice::from_raw_parts(ba, q8_k::BLOCK),
            )
        };
        iq1_s::value(b, a, isum)
    }
}

scalar_decoded!(Iq1m, iq1_m);
impl IqFormat for Iq1m {
    const BLOCK: usize = iq1_m::BLOCK;
    const SCALE32: bool = false;
    const PLAIN: bool = false;
    decoded_runs!();
    unsafe fn value(bw: *const u8, ba: *const u8, isum: i32) -> f32 {
        // SAFETY: whole blocks on both sides.
        let (b, a) = unsafe {
            (
                std::slice::from_raw_parts(bw, iq1_m::BLOCK),
                std::slice::from_raw_parts(ba, q8_k::BLOCK),
            )
        };
        iq1_m::value(b, a, isum)
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
        let (o, scales8) = unsafe {
            let o = F::open(bw);
            let sc = F::scales8(&o, bw);
            (o, sc)
        };
        let mut sumi = [_mm256_setzero_si256(); C];
        for ib in 0..8 {
            // SAFETY: a whole block.
            let (mags, signs) = unsafe { F::run(&o, bw, ib) };
            let sc = scale_pair(scales8, ib);
            for c in 0..C {
                // SAFETY: a Q8_K block has 256 quants from offset 4.
                let x = unsafe { load(a[c].add(i * q8_k::BLOCK + 4 + 32 * ib)) };
                let p = _mm256_maddubs_epi16(mags, _mm256_sign_epi8(x, signs));
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

/// An i-quant or ternary format in the AVX-512 GEMM's decoded form: its
/// signed values plus 128 as unsigned bytes (what `vpdpbusd` wants), its
/// sixteen scales, and correction words of four times the scales, which
/// the kernel's `isum - 32 * corr` (Q6_K's offset) turns into the `128 *
/// sum_g scale_g * bsum_g` the offset adds. The AVX2 GEMM cannot take
/// this form (`maddubs` would saturate on bytes past 127).
struct Iq<F>(std::marker::PhantomData<F>);

impl<F: IqFormat> KFormat for Iq<F> {
    const W: usize = F::BLOCK;
    const GROUP: usize = if F::SCALE32 { 8 } else { 4 };
    const MIN: bool = false;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(bw: *const u8, dst: *mut u8) {
        // SAFETY: a whole block at bw; dst holds DEC bytes (caller's contract).
        let o = unsafe { F::open(bw) };
        let flip = _mm256_set1_epi8(-128);
        for ib in 0..8 {
            // SAFETY: as above.
            unsafe {
                let (mags, signs) = F::run(&o, bw, ib);
                let v = _mm256_xor_si256(_mm256_sign_epi8(mags, signs), flip);
                _mm256_storeu_si256(dst.add(32 * ib) as *mut __m256i, v);
            }
        }
        // SAFETY: as above.
        let sc8 = unsafe { F::scales8(&o, bw) };
        let sc = _mm256_cvtepi8_epi16(sc8);
        let (lo, hi) = (_mm256_unpacklo_epi16(sc, sc), _mm256_unpackhi_epi16(sc, sc));
        // SAFETY: the scale words (16, or 8 with one scale per run: each
        // run's scale in both halves of its word) and the 8 correction
        // words of dst.
        unsafe {
            let st = |o: usize, v: __m256i| _mm256_storeu_si256(dst.add(o) as *mut __m256i, v);
            if F::SCALE32 {
                let even = _mm_shuffle_epi8(
                    sc8,
                    _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1),
                );
                let h = _mm_cvtepi8_epi16(even);
                st(
                    SCALES,
                    _mm256_set_m128i(_mm_unpackhi_epi16(h, h), _mm_unpacklo_epi16(h, h)),
                );
            } else {
                st(SCALES, _mm256_permute2x128_si256::<0x20>(lo, hi));
                st(SCALES + 32, _mm256_permute2x128_si256::<0x31>(lo, hi));
            }
            st(CORR, _mm256_slli_epi16::<2>(sc));
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(bw: *const u8) -> __m128 {
        // SAFETY: a whole block.
        _mm_set_ss(unsafe { F::d(bw) })
    }
}

/// Rows of a plain i-quant or ternary format against Q8_K activation rows
/// on the AVX-512 VNNI kernel (see `gemm_q4_k_avx512`). Same bits as the
/// format's `vec_dot`.
fn gemm_iq_avx512<F: IqFormat>(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]) {
    assert!(F::PLAIN, "the GEMM computes (d * d_a) * isum only");
    super::kgemm::gemm_avx512::<Iq<F>>(n, w_rows, acts, out)
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
                gemm_iq_avx512::<$fmt>(n, w_rows, acts, out)
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
