//! IQ4_XS weights repacked at load time for decode on AVX-512 VNNI:
//! sixteen rows interleaved, as Q4_K's (`q4k_packed.rs`), so that one
//! 64-byte load holds the same four index bytes of each of them and the
//! codebook lookup (one `vpshufb` per 64 nibbles) serves sixteen rows.
//!
//! Why: the row kernel (`iquants.rs`) decodes one row's block at a time,
//! about an instruction per weight, which holds decode to compute speed;
//! here a super-block of sixteen rows costs a few hundred instructions
//! and decode reads memory at Q4_K's pace.
//!
//! Layout, per group of sixteen rows and super-block (`PACKED_BLOCK`
//! bytes; the file's sixteen blocks take 2,176):
//! - `64 * (4 ib + l) + 4 * r`: bytes `4l .. 4l + 4` of row r's sub-block
//!   `ib` indices (their low nibbles are elements `32 ib + 4l ..`, their
//!   high ones `32 ib + 16 + 4l ..`);
//! - `SC + 16 * ib + r`: row r's scale of sub-block ib, less 32 (i8);
//! - `D + 2 * r`: row r's `d` (f16).
//!
//! Arithmetic: the codebook plus 128 (unsigned, for `vpdpbusd`), then per
//! sub-block `ls * (dot - 128 * sum of its 32 activations)`, the sums read
//! from Q8_K's 16-sums: the exact integer of the scalar reference, whose
//! value `(d_w * d_a) * isum` adds in block order from +0.0, lane by lane.
//! So the same bits as every other IQ4_XS path.

use std::arch::x86_64::*;

use super::packed_groups::{ahead_bytes, pack_groups, prefetch_line, prefetch_span};
use super::{read_f32, read_u32};
use crate::quant::iq_common::KVALUES_IQ4NL;
use crate::quant::{iq4_xs, q8_k, QK_K};

/// Rows per group: the sixteen i32 lanes.
pub const GROUP_ROWS: usize = 16;
const SC: usize = 32 * 64;
const D: usize = SC + 8 * 16;
/// Bytes per group and super-block.
pub const PACKED_BLOCK: usize = D + 2 * GROUP_ROWS;

/// The layout as the prefill GEMM over packed copies reads it.
pub(super) fn nibbles() -> super::kgemm::Nibbles {
    super::kgemm::Nibbles {
        table: KVALUES_IQ4NL.map(|v| (v as i32 + 128) as u8),
        factor: 1.0,
        sc: SC,
        d: D,
        per32: true,
        block: PACKED_BLOCK,
    }
}

/// Whether the CPU has what the kernel uses.
pub fn available() -> bool {
    super::q4k_packed::available()
}

/// The sixteen blocks' indices into the packed words: two sub-blocks (32
/// bytes a row) per 16 x 8-word transpose.
///
/// # Safety
/// AVX2 and AVX-512 F are available; every block holds `iq4_xs::BLOCK`
/// bytes and `dst` `PACKED_BLOCK`.
#[target_feature(enable = "avx2,avx512f")]
unsafe fn transpose_quants(blocks: &[&[u8]; GROUP_ROWS], dst: &mut [u8]) {
    for k in 0..4 {
        // SAFETY: bytes 8 + 32k .. 40 + 32k of each block.
        let v: [__m256i; GROUP_ROWS] = std::array::from_fn(|r| unsafe {
            _mm256_loadu_si256(blocks[r].as_ptr().add(8 + 32 * k) as *const __m256i)
        });
        for (j, t) in super::rows16_vnni::transpose(v).iter().enumerate() {
            // SAFETY: word 8k + j (sub-block 2k + j / 4, word j % 4).
            unsafe {
                _mm512_storeu_si512(dst.as_mut_ptr().add(64 * (8 * k + j)) as *mut __m512i, *t)
            };
        }
    }
}

/// Writes into `out` (`rows / 16 * cols / 256 * PACKED_BLOCK` bytes) the
/// packed form of an IQ4_XS matrix of `rows` (a multiple of 16) rows of
/// `cols` elements held in `data` (the file's layout).
pub fn pack(rows: usize, cols: usize, data: &[u8], out: &mut [u8]) {
    assert!(available(), "iq4_xs packing without AVX-512");
    let sizes = (QK_K, iq4_xs::BLOCK, PACKED_BLOCK);
    pack_groups("iq4_xs", sizes, rows, cols, data, out, |blocks, dst| {
        // SAFETY: AVX-512 F was checked above; every block holds
        // iq4_xs::BLOCK bytes and `dst` PACKED_BLOCK.
        unsafe { transpose_quants(blocks, dst) };
        for (r, b) in blocks.iter().enumerate() {
            for ib in 0..8 {
                dst[SC + 16 * ib + r] = iq4_xs::scale(b, ib) as i8 as u8;
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
unsafe fn pass<const N: usize>(nb: usize, grp: *const u8, a: [*const u8; N], out: [*mut f32; N]) {
    let m4 = _mm512_set1_epi8(0x0f);
    let zero = _mm512_setzero_si512();
    let table: [u8; 16] = KVALUES_IQ4NL.map(|v| (v as i32 + 128) as u8);
    // SAFETY: sixteen bytes.
    let table =
        _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(table.as_ptr() as *const __m128i) });
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
            // SAFETY: the sixteen scales of sub-block ib.
            let ls = _mm512_cvtepi8_epi32(unsafe {
                _mm_loadu_si128(blk.add(SC + 16 * ib) as *const __m128i)
            });
            for t in 0..N {
                // SAFETY: the 16-sums 2ib and 2ib + 1 of token t's block i.
                let s32 = unsafe {
                    i16::from_le_bytes([*ab[t].add(260 + 4 * ib), *ab[t].add(261 + 4 * ib)]) as i32
                        + i16::from_le_bytes([*ab[t].add(262 + 4 * ib), *ab[t].add(263 + 4 * ib)])
                            as i32
                };
                let dot = _mm512_sub_epi32(
                    _mm512_add_epi32(dlo[t], dhi[t]),
                    _mm512_set1_epi32(128 * s32),
                );
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot, ls));
            }
        }
        // SAFETY: the sixteen d of this packed block.
        let dw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(blk.add(D) as *const __m256i) });
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

super::packed_groups::q8k_packed_tile!("IQ4_XS");
