//! Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 weights repacked at load time for decode on
//! AVX-512 VNNI: sixteen rows interleaved so that one 64-byte load holds
//! the same four quant bytes of each of them.
//!
//! Why: the row tile (`rows16_vnni.rs`) gathers sixteen rows' blocks from
//! sixteen places, expands their nibbles and transposes them with two
//! dozen shuffles per block. Interleaved once at load, a block of sixteen
//! rows is four 64-byte words, a mask and a shift each, eight `vpdpbusd`
//! and the scales as vectors. The layout takes exactly the file's bytes.
//!
//! Layout, per group of sixteen rows and block of 32 elements
//! (`F::PACKED` bytes, groups one after another, a group's blocks in
//! order):
//! - `64 * w + 4 * r`: quant bytes `4w .. 4w + 4` of row r (their low
//!   nibbles are elements `4w ..`, their high ones elements `16 + 4w ..`);
//! - `256 + 4 * r` (Q5_0, Q5_1): row r's 32 fifth bits (`qh`, bit k for
//!   element k), which `vpmultishiftqb` moves under each byte's nibble;
//! - `F::SC + 2 * r` (after the fifth bits, if any): row r's scale `d`
//!   (f16; MXFP4: `F::SC + r`, its exponent byte as the file has it);
//! - `F::SC + 32 + 2 * r` (Q4_1, Q5_1): row r's minimum `m` (f16).
//!
//! Bits: per block, `fma(isum, d_w * d_a, acc)` and, with a minimum, `mins +
//! m_w * s_a`, from +0.0 in block order and `acc + mins` at the end, lane
//! by lane: the row tile's arithmetic, so the same bits as every other
//! path of these formats.

use std::arch::x86_64::*;

use super::packed_groups::{ahead_bytes, prefetch_ahead, run_groups, sides, BlockSide, GroupPass};
use super::{read_u32, Block32};

/// Rows per group: the sixteen i32 lanes.
pub const GROUP_ROWS: usize = 16;
const QK: usize = 32;
/// The sixteen rows' fifth bits, after the quant words.
const QH_AT: usize = 4 * 64;

/// What the packed kernel needs of a format beyond `Block32`.
pub(super) trait Nibbles: Block32 {
    /// Where a block's sixteen quant bytes start.
    const QS: usize;
    /// Where its 32 fifth bits start (the 5-bit formats).
    const QH: Option<usize>;
    /// The codebook a nibble indexes, as `uquants` gives it (the value
    /// plus `OFFSET`), for the non-linear formats; `None` where the
    /// nibble is the value.
    const LOOKUP: Option<[i8; 16]> = None;
    /// The scales are e8m0 exponent bytes (MXFP4's powers of two reach
    /// past f16's range), kept as the file has them and turned into f32
    /// in the kernel, so the layout stays the file's size.
    const E8M0_SCALES: bool = false;
    /// Where the scales start in a packed block.
    const SC: usize = QH_AT + if Self::QH.is_some() { 64 } else { 0 };
    /// Bytes per group and block: the file's sixteen blocks.
    const PACKED: usize = Self::SC
        + if Self::MIN {
            64
        } else if Self::E8M0_SCALES {
            16
        } else {
            32
        };
}

/// `values` plus `offset`, wrapping: the unsigned bytes `vpdpbusd` reads.
const fn offset_table(values: [i8; 16], offset: i32) -> [i8; 16] {
    let mut t = [0i8; 16];
    let mut k = 0;
    while k < 16 {
        t[k] = (values[k] as i32 + offset) as u8 as i8;
        k += 1;
    }
    t
}

impl Nibbles for super::iq4_nl::Iq4Nl {
    const QS: usize = 2;
    const QH: Option<usize> = None;
    const LOOKUP: Option<[i8; 16]> = Some(offset_table(
        crate::quant::iq_common::KVALUES_IQ4NL,
        <Self as Block32>::OFFSET,
    ));
}

impl Nibbles for super::mxfp4::Mxfp4 {
    const QS: usize = 1;
    const QH: Option<usize> = None;
    const LOOKUP: Option<[i8; 16]> = Some(offset_table(
        crate::quant::iq_common::KVALUES_MXFP4,
        <Self as Block32>::OFFSET,
    ));
    const E8M0_SCALES: bool = true;
}

impl Nibbles for super::q4_0::Q4_0 {
    const QS: usize = 2;
    const QH: Option<usize> = None;
}

impl Nibbles for super::q4_1::Q4_1 {
    const QS: usize = 4;
    const QH: Option<usize> = None;
}

impl Nibbles for super::q5_0::Q5_0 {
    const QS: usize = 6;
    const QH: Option<usize> = Some(2);
}

impl Nibbles for super::q5_1::Q5_1 {
    const QS: usize = 8;
    const QH: Option<usize> = Some(4);
}

/// Whether the CPU has what the kernel uses (`vpmultishiftqb` is
/// AVX-512 VBMI, for the 5-bit formats' fifth bits).
pub fn available() -> bool {
    super::q4k_packed::available() && is_x86_feature_detected!("avx512vbmi")
}

/// Writes into `out` (`rows / 16 * cols / 32 * F::PACKED` bytes) the
/// packed form of a matrix of `rows` (a multiple of 16) rows of `cols`
/// elements held in `data` (the file's layout).
pub(super) fn pack<F: Nibbles>(rows: usize, cols: usize, data: &[u8], out: &mut [u8]) {
    let nb = cols / QK;
    let rb = nb * F::W;
    assert!(
        rows.is_multiple_of(GROUP_ROWS) && cols.is_multiple_of(QK) && data.len() == rows * rb,
        "q4 pack shape"
    );
    assert_eq!(
        out.len(),
        rows / GROUP_ROWS * nb * F::PACKED,
        "q4 packed size"
    );
    for (gi, dst) in out.chunks_exact_mut(F::PACKED).enumerate() {
        let (g, i) = (gi / nb, gi % nb);
        for r in 0..GROUP_ROWS {
            let b = &data[(g * GROUP_ROWS + r) * rb + i * F::W..][..F::W];
            for w in 0..4 {
                let at = 64 * w + 4 * r;
                dst[at..at + 4].copy_from_slice(&b[F::QS + 4 * w..F::QS + 4 * w + 4]);
            }
            if let Some(qh) = F::QH {
                dst[QH_AT + 4 * r..QH_AT + 4 * r + 4].copy_from_slice(&b[qh..qh + 4]);
            }
            let sc = F::SC;
            if F::E8M0_SCALES {
                dst[sc + r] = b[0];
            } else {
                dst[sc + 2 * r..sc + 2 * r + 2].copy_from_slice(&b[0..2]);
            }
            if F::MIN {
                dst[sc + 32 + 2 * r..sc + 34 + 2 * r].copy_from_slice(&b[2..4]);
            }
        }
    }
}

/// The sixteen rows of one group (`grp`: its `nb` packed blocks) against
/// `N` activation rows (Q8_0 for Q4_0, Q8_1 for Q4_1) whose blocks'
/// scalars are `side[t]` (`sides::<F>`); writes each token's sixteen
/// values to `out[t]`.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 F/BW/VL and VNNI are available; `grp` holds
/// `nb * F::PACKED` bytes, every `a[t]` `nb` activation blocks and every
/// `side[t]` `nb` entries.
/// Every `out[t]` has sixteen writable floats.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
unsafe fn pass<F: Nibbles, const N: usize>(
    nb: usize,
    grp: *const u8,
    a: [*const u8; N],
    side: [*const BlockSide; N],
    out: [*mut f32; N],
) {
    let m4 = _mm512_set1_epi8(0x0f);
    let b4 = _mm512_set1_epi8(0x10);
    // `vpmultishiftqb` controls: byte b of each row's word w takes the 8
    // bits of its qword that start 4 below its element's fifth bit (4w + b
    // for the low nibbles, 16 + 4w + b for the high ones; the odd row of a
    // qword 32 further on), so that bit lands on bit 4. Offsets wrap
    // modulo 64, which makes -4 the 60 that reaches bit 0.
    let ctl = |w: usize, base: usize| {
        let c: [u8; 8] = std::array::from_fn(|j| {
            let (row, b) = (j / 4, j % 4);
            ((32 * row + base + 4 * w + b + 60) % 64) as u8
        });
        _mm512_set1_epi64(i64::from_le_bytes(c))
    };
    let ctl_lo: [__m512i; 4] = std::array::from_fn(|w| ctl(w, 0));
    let ctl_hi: [__m512i; 4] = std::array::from_fn(|w| ctl(w, 16));
    let lookup = F::LOOKUP.map(|t| {
        // SAFETY: sixteen bytes.
        let t = unsafe { _mm_loadu_si128(t.as_ptr() as *const __m128i) };
        _mm512_broadcast_i32x4(t)
    });
    let mut acc = [_mm512_setzero_ps(); N];
    let mut mins = [_mm512_setzero_ps(); N];
    let ahead = ahead_bytes::<N>();
    for i in 0..nb {
        let blk = grp.wrapping_add(i * F::PACKED);
        prefetch_ahead(blk, ahead, F::PACKED);
        let ab: [*const u8; N] = std::array::from_fn(|t| a[t].wrapping_add(i * F::A));
        let q0 = F::A - QK;
        // Up to four tokens, low and high nibbles in separate sums: the
        // chains interleave. Eight tokens interleave eight chains already,
        // and two sums each would not fit the registers. Integer sums: the
        // split cannot change them.
        let split = N <= 4;
        let mut s = [[_mm512_setzero_si512(); 2]; N];
        // SAFETY: the fifth bits of this packed block (5-bit formats).
        let qh = F::QH.map(|_| unsafe { _mm512_loadu_si512(blk.add(QH_AT) as *const __m512i) });
        for w in 0..4 {
            // SAFETY: word w of this packed block.
            let q = unsafe { _mm512_loadu_si512(blk.add(64 * w) as *const __m512i) };
            let mut lo = _mm512_and_si512(q, m4);
            let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
            if let Some(t) = lookup {
                lo = _mm512_shuffle_epi8(t, lo);
                hi = _mm512_shuffle_epi8(t, hi);
            }
            if let Some(qh) = qh {
                // lo | (bits & 0x10), one ternary-logic op each.
                let (bl, bh) = (
                    _mm512_multishift_epi64_epi8(ctl_lo[w], qh),
                    _mm512_multishift_epi64_epi8(ctl_hi[w], qh),
                );
                lo = _mm512_ternarylogic_epi32::<0xF8>(lo, bl, b4);
                hi = _mm512_ternarylogic_epi32::<0xF8>(hi, bh, b4);
            }
            for t in 0..N {
                // SAFETY: quants 4w.. and 16 + 4w.. of token t's block i.
                let (xl, xh) = unsafe {
                    (
                        read_u32(ab[t].add(q0 + 4 * w)),
                        read_u32(ab[t].add(q0 + 16 + 4 * w)),
                    )
                };
                s[t][0] = _mm512_dpbusd_epi32(s[t][0], lo, _mm512_set1_epi32(xl as i32));
                s[t][split as usize] =
                    _mm512_dpbusd_epi32(s[t][split as usize], hi, _mm512_set1_epi32(xh as i32));
            }
        }
        // SAFETY: the sixteen scales (and minimums) of this packed block.
        let dw = if F::E8M0_SCALES {
            // SAFETY: the sixteen exponent bytes of this packed block.
            let e =
                _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(blk.add(F::SC) as *const __m128i) });
            // `mxfp4::e8m0_half`: (e - 1) << 23, or 2^21 << e below e = 2.
            let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1)));
            let tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
            let below = _mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2));
            _mm512_castsi512_ps(_mm512_mask_blend_epi32(below, normal, tiny))
        } else {
            // SAFETY: the sixteen f16 scales of this packed block.
            _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(blk.add(F::SC) as *const __m256i) })
        };
        let mw = if F::MIN {
            // SAFETY: as above.
            _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(blk.add(F::SC + 32) as *const __m256i) })
        } else {
            _mm512_setzero_ps()
        };
        for t in 0..N {
            // SAFETY: token t's block-i scalars.
            let sd = unsafe { &*side[t].add(i) };
            let mut isum = _mm512_add_epi32(s[t][0], s[t][1]);
            if F::OFFSET != 0 {
                isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(sd.off));
            }
            let prod = _mm512_mul_ps(dw, _mm512_set1_ps(sd.d));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), prod, acc[t]);
            if F::MIN {
                mins[t] = _mm512_add_ps(mins[t], _mm512_mul_ps(mw, _mm512_set1_ps(sd.s)));
            }
        }
    }
    if F::MIN {
        for t in 0..N {
            acc[t] = _mm512_add_ps(acc[t], mins[t]);
        }
    }
    for t in 0..N {
        // SAFETY: sixteen floats at each `out[t]` (caller's contract).
        unsafe { _mm512_storeu_ps(out[t], acc[t]) };
    }
}

/// Groups `g0..g1` of a packed matrix of `n`-element rows against every
/// activation row: `outs[t][(g - g0) * 16 + r]` is row `16g + r` against
/// token t. `side` is the table `side_for` (`sides::<F>`) filled for
/// `acts`.
pub(super) fn tile<F: Nibbles>(
    n: usize,
    packed: &[u8],
    groups: (usize, usize),
    acts: &[&[u8]],
    side: &[BlockSide],
    outs: &mut [&mut [f32]],
) {
    assert!(available(), "packed Q4 kernel without AVX-512 VNNI");
    let nb = n / QK;
    assert!(
        n.is_multiple_of(QK)
            && acts.iter().all(|a| a.len() >= nb * F::A)
            && side.len() == acts.len() * nb,
        "packed tile operand too short"
    );
    // SAFETY: the features were asserted above.
    unsafe { run_groups::<Packed<F>>(nb, packed, groups, acts, side, outs) }
}

/// A 32-element format's layout, for `run_groups`.
struct Packed<F>(std::marker::PhantomData<F>);

impl<F: Nibbles> GroupPass for Packed<F> {
    const PACKED: usize = F::PACKED;
    unsafe fn pass<const N: usize>(
        nb: usize,
        grp: *const u8,
        a: [*const u8; N],
        side: [*const BlockSide; N],
        out: [*mut f32; N],
    ) {
        // SAFETY: the trait's contract is `pass`'s.
        unsafe { pass::<F, N>(nb, grp, a, side, out) }
    }
}

/// `pack` for one of the six formats (`ty` names it).
pub fn pack_for(ty: crate::quant::GgmlType, rows: usize, cols: usize, data: &[u8], out: &mut [u8]) {
    use crate::quant::GgmlType as T;
    match ty {
        T::Q4_0 => pack::<super::q4_0::Q4_0>(rows, cols, data, out),
        T::Q4_1 => pack::<super::q4_1::Q4_1>(rows, cols, data, out),
        T::Q5_0 => pack::<super::q5_0::Q5_0>(rows, cols, data, out),
        T::Q5_1 => pack::<super::q5_1::Q5_1>(rows, cols, data, out),
        T::IQ4NL => pack::<super::iq4_nl::Iq4Nl>(rows, cols, data, out),
        T::MXFP4 => pack::<super::mxfp4::Mxfp4>(rows, cols, data, out),
        other => unreachable!("{} is not a packed 32-element format", other.name()),
    }
}

/// The scalars `tile` reads of each activation block, for the weight
/// format `ty` (one of the six) against rows of `n` elements.
pub fn side_for(ty: crate::quant::GgmlType, n: usize, acts: &[&[u8]], out: &mut Vec<BlockSide>) {
    use crate::quant::GgmlType as T;
    let nb = n / QK;
    match ty {
        T::Q4_0 => sides::<super::q4_0::Q4_0>(acts, nb, out),
        T::Q4_1 => sides::<super::q4_1::Q4_1>(acts, nb, out),
        T::Q5_0 => sides::<super::q5_0::Q5_0>(acts, nb, out),
        T::Q5_1 => sides::<super::q5_1::Q5_1>(acts, nb, out),
        T::IQ4NL => sides::<super::iq4_nl::Iq4Nl>(acts, nb, out),
        T::MXFP4 => sides::<super::mxfp4::Mxfp4>(acts, nb, out),
        other => unreachable!("{} is not a packed 32-element format", other.name()),
    }
}

/// `tile` for one of the six formats (`ty` names it).
pub fn tile_for(
    ty: crate::quant::GgmlType,
    n: usize,
    p: &[u8],
    g: (usize, usize),
    a: &[&[u8]],
    sd: &[BlockSide],
    o: &mut [&mut [f32]],
) {
    use crate::quant::GgmlType as T;
    match ty {
        T::Q4_0 => tile::<super::q4_0::Q4_0>(n, p, g, a, sd, o),
        T::Q4_1 => tile::<super::q4_1::Q4_1>(n, p, g, a, sd, o),
        T::Q5_0 => tile::<super::q5_0::Q5_0>(n, p, g, a, sd, o),
        T::Q5_1 => tile::<super::q5_1::Q5_1>(n, p, g, a, sd, o),
        T::IQ4NL => tile::<super::iq4_nl::Iq4Nl>(n, p, g, a, sd, o),
        T::MXFP4 => tile::<super::mxfp4::Mxfp4>(n, p, g, a, sd, o),
        other => unreachable!("{} is not a packed 32-element format", other.name()),
    }
}

/// Bytes per group and block of a format (the file's sixteen blocks).
pub fn packed_block(ty: crate::quant::GgmlType) -> Option<usize> {
    use crate::quant::GgmlType as T;
    Some(match ty {
        T::Q4_0 => <super::q4_0::Q4_0 as Nibbles>::PACKED,
        T::Q4_1 => <super::q4_1::Q4_1 as Nibbles>::PACKED,
        T::Q5_0 => <super::q5_0::Q5_0 as Nibbles>::PACKED,
        T::Q5_1 => <super::q5_1::Q5_1 as Nibbles>::PACKED,
        T::IQ4NL => <super::iq4_nl::Iq4Nl as Nibbles>::PACKED,
        T::MXFP4 => <super::mxfp4::Mxfp4 as Nibbles>::PACKED,
        _ => return None,
    })
}
