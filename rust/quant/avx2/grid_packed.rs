//! The grid i-quants (IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, IQ2_XXS) repacked at
//! load time for decode on AVX-512 VNNI: each weight becomes a 4-bit code
//! into a sixteen-entry signed codebook, sixteen rows interleaved as
//! IQ4_XS's are (`iq4xs_packed.rs`), so one `vpshufb` per 64 weights
//! serves sixteen rows.
//!
//! Why: a grid format stores indices of 4- or 8-weight points, so the row
//! kernel (`iquants.rs`) spends one scalar table load per four or eight
//! weights and a sign lookup beside it: about 85 cycles per super-block
//! per thread, and decode runs at that compute speed (below llama.cpp's,
//! which does the same). Every point of these grids takes its magnitudes
//! from eight values at most (IQ3_S: 1, 3, .., 15; IQ3_XXS: 4, 12, .., 62;
//! the IQ2s: 8, 25, 43), so magnitude and sign fit a nibble, and decode
//! then reads memory at IQ4_XS's pace. The cost is memory: 4.56 bits a
//! weight instead of the file's 2.06 (IQ2_XXS) to 3.44 (IQ3_S);
//! `OXILLAMA_REPACK=0` keeps the file's layout and the row kernel.
//!
//! Layout, per group of sixteen rows and super-block (`PACKED_BLOCK`):
//! - `64 * (4 ib + l) + 4 * r`: four code bytes of row r's sub-block `ib`
//!   (their low nibbles are elements `32 ib + 4l ..`, their high ones
//!   `32 ib + 16 + 4l ..`);
//! - `SC + 16 * g + r`: row r's integer scale of 16-element group g (i8;
//!   the per-32 formats repeat theirs);
//! - `D + 2 * r`: row r's `d` (f16, the file's).
//!
//! Arithmetic: the codebook plus 128 (unsigned, for `vpdpbusd`), then per
//! group `ls * (dot - 128 * sum of its 16 activations)`, the sums read
//! from Q8_K's 16-sums: the exact integer of the scalar reference
//! (`iq_common::dot_rows`), whose value `((d_w * factor) * d_a) * isum`
//! adds in block order from +0.0, lane by lane. The factor is a power of
//! two, so `d_w * factor` is exact in f32. The same bits as every path of
//! these formats.

use std::arch::x86_64::*;

use super::packed_groups::{ahead_bytes, pack_groups, prefetch_line, prefetch_span};
use super::{read_f32, read_u32};
use crate::quant::iq_common::Decoded;
use crate::quant::{iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs, q8_k, GgmlType, QK_K};

/// Rows per group: the sixteen i32 lanes.
pub const GROUP_ROWS: usize = 16;
pub(crate) const SC: usize = 32 * 64;
pub(crate) const D: usize = SC + 16 * 16;
/// Bytes per group and super-block.
pub const PACKED_BLOCK: usize = D + 2 * GROUP_ROWS;

/// One grid format: how a file block decodes, its file block size, the
/// power of two ggml applies to a row's sum, and the magnitudes its grid
/// points take (codes 0..8 are these, 8..16 their negatives).
pub(crate) struct GridFormat {
    pub ty: GgmlType,
    pub block: usize,
    pub decode: fn(&[u8], &mut Decoded),
    pub factor: f32,
    pub magnitudes: [u8; 8],
}

const IQ2_MAGNITUDES: [u8; 8] = [8, 25, 43, 0, 0, 0, 0, 0];

/// The formats this layout serves.
pub(crate) const FORMATS: [GridFormat; 5] = [
    GridFormat {
        ty: GgmlType::IQ3S,
        block: iq3_s::BLOCK,
        decode: iq3_s::decode,
        factor: 1.0,
        magnitudes: [1, 3, 5, 7, 9, 11, 13, 15],
    },
    GridFormat {
        ty: GgmlType::IQ3XXS,
        block: iq3_xxs::BLOCK,
        decode: iq3_xxs::decode,
        factor: 0.25,
        magnitudes: [4, 12, 20, 28, 36, 44, 52, 62],
    },
    GridFormat {
        ty: GgmlType::IQ2S,
        block: iq2_s::BLOCK,
        decode: iq2_s::decode,
        factor: 0.125,
        magnitudes: IQ2_MAGNITUDES,
    },
    GridFormat {
        ty: GgmlType::IQ2XS,
        block: iq2_xs::BLOCK,
        decode: iq2_xs::decode,
        factor: 0.125,
        magnitudes: IQ2_MAGNITUDES,
    },
    GridFormat {
        ty: GgmlType::IQ2XXS,
        block: iq2_xxs::BLOCK,
        decode: iq2_xxs::decode,
        factor: 0.125,
        magnitudes: IQ2_MAGNITUDES,
    },
];

/// The format entry of `ty`, if this layout serves it.
pub(crate) fn format(ty: GgmlType) -> Option<&'static GridFormat> {
    FORMATS.iter().find(|f| f.ty == ty)
}

impl GridFormat {
    /// The codebook as `vpdpbusd`'s unsigned operand: each value plus 128.
    pub(crate) fn table(&self) -> [u8; 16] {
        std::array::from_fn(|c| {
            let m = self.magnitudes[c % 8] as i32;
            (if c < 8 { m + 128 } else { 128 - m }) as u8
        })
    }

    /// The code of a decoded value: its magnitude's slot, plus 8 if
    /// negative. Decoded values are grid magnitudes with a sign, so every
    /// one has a slot (`every_grid_value_has_a_code` checks each grid).
    fn code(&self, v: i8) -> u8 {
        let m = v.unsigned_abs();
        let slot = self.magnitudes.iter().position(|&x| x == m).unwrap_or(0) as u8;
        if v < 0 {
            slot + 8
        } else {
            slot
        }
    }
}

/// Whether the CPU has what the kernel uses.
pub fn available() -> bool {
    super::q4k_packed::available()
}

/// Whether the prefill GEMM over the packed copy (`gemm`) may run: the
/// AVX-512 VNNI GEMM is on.
pub fn gemm_available() -> bool {
    super::kgemm::avx512_enabled()
}

/// Writes into `out` (`rows / 16 * cols / 256 * PACKED_BLOCK` bytes) the
/// packed form of a matrix of `ty` (one of `FORMATS`) of `rows` (a
/// multiple of 16) rows of `cols` elements held in `data` (the file's
/// layout).
pub fn pack(ty: GgmlType, rows: usize, cols: usize, data: &[u8], out: &mut [u8]) {
    let f = format(ty).expect("a grid format");
    let sizes = (QK_K, f.block, PACKED_BLOCK);
    // Value -> code, once: a decoded block is 256 lookups.
    let codes: [u8; 256] = std::array::from_fn(|v| f.code(v as u8 as i8));
    let mut dec = Decoded::new();
    pack_groups(ty.name(), sizes, rows, cols, data, out, |blocks, dst| {
        for (r, b) in blocks.iter().enumerate() {
            (f.decode)(b, &mut dec);
            for ib in 0..8 {
                for k in 0..16 {
                    let lo = codes[dec.q[32 * ib + k] as u8 as usize];
                    let hi = codes[dec.q[32 * ib + 16 + k] as u8 as usize];
                    let (l, j) = (k / 4, k % 4);
                    dst[64 * (4 * ib + l) + 4 * r + j] = lo | (hi << 4);
                }
            }
            for g in 0..16 {
                // Scales are 2s + 1 with s < 16: they fit an i8.
                dst[SC + 16 * g + r] = dec.scales[g] as i8 as u8;
            }
            dst[D + 2 * r..D + 2 * r + 2].copy_from_slice(&b[0..2]);
        }
    });
}

/// The sixteen rows of one group (`grp`: its `nb` packed super-blocks)
/// against `N` Q8_K activation rows; writes each token's sixteen values
/// to `out[t]`.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 F/BW/VL and VNNI are available; `grp` holds
/// `nb * PACKED_BLOCK` bytes and every `a[t]` `nb` Q8_K blocks.
/// Every `out[t]` has sixteen writable floats.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pass<const N: usize>(
    f: &GridFormat,
    nb: usize,
    grp: *const u8,
    a: [*const u8; N],
    out: [*mut f32; N],
) {
    let m4 = _mm512_set1_epi8(0x0f);
    let zero = _mm512_setzero_si512();
    let table = f.table();
    // SAFETY: sixteen bytes.
    let table =
        _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(table.as_ptr() as *const __m128i) });
    let factor = _mm512_set1_ps(f.factor);
    let mut acc = [_mm512_setzero_ps(); N];
    let ahead = ahead_bytes::<N>();
    for i in 0..nb {
        let blk = grp.wrapping_add(i * PACKED_BLOCK);
        prefetch_span(blk, ahead, SC, PACKED_BLOCK);
        let ab: [*const u8; N] = std::array::from_fn(|t| a[t].wrapping_add(i * q8_k::BLOCK));
        let mut isum = [zero; N];
        for ib in 0..8 {
            let (mut dlo, mut dhi) = ([zero; N], [zero; N]);
            for l in 0..4 {
                let w = 4 * ib + l;
                // SAFETY: word w of this packed block.
                let q = unsafe { _mm512_loadu_si512(blk.add(64 * w) as *const __m512i) };
                prefetch_line(blk, ahead, 64 * w);
                let lo = _mm512_shuffle_epi8(table, _mm512_and_si512(q, m4));
                let hi =
                    _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4));
                for t in 0..N {
                    // SAFETY: quants 32ib + 4l.. and 32ib + 16 + 4l.. of
                    // token t's block i.
                    let (xl, xh) = unsafe {
                        (
                            read_u32(ab[t].add(4 + 32 * ib + 4 * l)),
                            read_u32(ab[t].add(20 + 32 * ib + 4 * l)),
                        )
                    };
                    dlo[t] = _mm512_dpbusd_epi32(dlo[t], lo, _mm512_set1_epi32(xl as i32));
                    dhi[t] = _mm512_dpbusd_epi32(dhi[t], hi, _mm512_set1_epi32(xh as i32));
                }
            }
            // SAFETY: the sixteen scales of groups 2ib and 2ib + 1.
            let (ls_lo, ls_hi) = unsafe {
                (
                    _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(SC + 32 * ib) as *const __m128i)),
                    _mm512_cvtepi8_epi32(_mm_loadu_si128(
                        blk.add(SC + 32 * ib + 16) as *const __m128i
                    )),
                )
            };
            for t in 0..N {
                // SAFETY: the 16-sums 2ib and 2ib + 1 of token t's block i.
                let (s_lo, s_hi) = unsafe {
                    (
                        i16::from_le_bytes([*ab[t].add(260 + 4 * ib), *ab[t].add(261 + 4 * ib)])
                            as i32,
                        i16::from_le_bytes([*ab[t].add(262 + 4 * ib), *ab[t].add(263 + 4 * ib)])
                            as i32,
                    )
                };
                let lo = _mm512_sub_epi32(dlo[t], _mm512_set1_epi32(128 * s_lo));
                let hi = _mm512_sub_epi32(dhi[t], _mm512_set1_epi32(128 * s_hi));
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(lo, ls_lo));
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(hi, ls_hi));
            }
        }
        // SAFETY: the sixteen d of this packed block.
        let dw = _mm512_mul_ps(
            _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(blk.add(D) as *const __m256i) }),
            factor,
        );
        for t in 0..N {
            // SAFETY: token t's block-i scale.
            let da = _mm512_set1_ps(unsafe { read_f32(ab[t]) });
            // The scalar reference's block value, lane by lane, to the bit.
            let v = _mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum[t]));
            acc[t] = _mm512_add_ps(acc[t], v);
        }
    }
    for t in 0..N {
        // SAFETY: sixteen floats at each `out[t]` (caller's contract).
        unsafe { _mm512_storeu_ps(out[t], acc[t]) };
    }
}

/// Groups `g0..g1` of a packed matrix of `ty` with `n`-element rows
/// against every activation row: `outs[t][(g - g0) * 16 + r]` is row
/// `16g + r` against token t.
pub fn tile(
    ty: GgmlType,
    n: usize,
    packed: &[u8],
    groups: (usize, usize),
    acts: &[&[u8]],
    outs: &mut [&mut [f32]],
) {
    assert!(available(), "packed grid kernel without AVX-512 VNNI");
    // SAFETY: the features were asserted above.
    unsafe {
        match ty {
            GgmlType::IQ3S => tile_of::<0>(n, packed, groups, acts, outs),
            GgmlType::IQ3XXS => tile_of::<1>(n, packed, groups, acts, outs),
            GgmlType::IQ2S => tile_of::<2>(n, packed, groups, acts, outs),
            GgmlType::IQ2XS => tile_of::<3>(n, packed, groups, acts, outs),
            GgmlType::IQ2XXS => tile_of::<4>(n, packed, groups, acts, outs),
            _ => panic!("{} is not a grid format", ty.name()),
        }
    }
}

/// Row groups `g0..g1` of a packed matrix of `ty` (a grid format, or
/// IQ4_XS in `iq4xs_packed`'s layout) against `acts` (more tokens than a
/// decode step: a prefill), in `GemmFn`'s layout for those rows; the
/// prefill GEMM over the packed copy, so the file's pages are not read
/// again. Same bits as the file layout's GEMM.
pub fn gemm(
    ty: GgmlType,
    n: usize,
    packed: &[u8],
    groups: (usize, usize),
    acts: &[&[u8]],
    out: &mut [f32],
) {
    assert!(
        super::kgemm::avx512_enabled(),
        "packed grid GEMM without AVX-512 VNNI"
    );
    let lay = match ty {
        GgmlType::IQ4XS => super::iq4xs_packed::nibbles(),
        _ => {
            let f = format(ty).expect("a grid format or IQ4_XS");
            super::kgemm::Nibbles {
                table: f.table(),
                factor: f.factor,
                sc: SC,
                d: D,
                per32: false,
                block: PACKED_BLOCK,
            }
        }
    };
    super::kgemm::gemm_nibbles(&lay, n, packed, groups, acts, out)
}

/// `tile` for `FORMATS[F]`.
///
/// # Safety
/// AVX-512 VNNI and the rest of `pass`'s features are present.
unsafe fn tile_of<const F: usize>(
    n: usize,
    packed: &[u8],
    groups: (usize, usize),
    acts: &[&[u8]],
    outs: &mut [&mut [f32]],
) {
    // SAFETY: the caller's features; `q8k_tile` checks the operands.
    unsafe { super::packed_groups::q8k_tile::<Layout<F>>(n, packed, groups, acts, outs) }
}

/// The pass of `FORMATS[F]`, for `run_groups` (it reads Q8_K's own sums).
struct Layout<const F: usize>;

impl<const F: usize> super::packed_groups::GroupPass for Layout<F> {
    const PACKED: usize = PACKED_BLOCK;
    unsafe fn pass<const N: usize>(
        nb: usize,
        grp: *const u8,
        a: [*const u8; N],
        _side: [*const super::packed_groups::BlockSide; N],
        out: [*mut f32; N],
    ) {
        // SAFETY: the trait's contract is `pass`'s.
        unsafe { pass::<N>(&FORMATS[F], nb, grp, a, out) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

    #[test]
    fn every_grid_value_has_a_code() {
        let grids: [(GgmlType, Vec<u8>); 5] = [
            (GgmlType::IQ3S, IQ3S_GRID.concat()),
            (GgmlType::IQ3XXS, IQ3XXS_GRID.concat()),
            (GgmlType::IQ2S, IQ2S_GRID.concat()),
            (GgmlType::IQ2XS, IQ2XS_GRID.concat()),
            (GgmlType::IQ2XXS, IQ2XXS_GRID.concat()),
        ];
        for (ty, values) in grids {
            let f = format(ty).unwrap();
            let table = f.table();
            for &m in &values {
                assert!(f.magnitudes.contains(&m), "{} magnitude {m}", ty.name());
                for v in [m as i8, -(m as i8)] {
                    let c = f.code(v) as usize;
                    assert!(c < 16);
                    assert_eq!(table[c] as i32 - 128, v as i32, "{} value {v}", ty.name());
                }
            }
        }
    }
}
