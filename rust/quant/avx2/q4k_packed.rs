//! Q4_K weights repacked at load time for decode on AVX-512 VNNI: sixteen
//! rows interleaved so that one 64-byte load holds the same four quant
//! bytes of each of them.
//!
//! Why: decode reads every weight once per token, and the row-by-row
//! kernel (`q4_k.rs`) spends about a hundred instructions per super-block
//! on a single row (unpacking its scales, horizontal sums, a scalar tail),
//! which on two cores holds decode to about half the memory's bandwidth.
//! With the rows in the lanes, a 64-byte load, two masks and two
//! `vpdpbusd`s advance sixteen rows by eight products each, the scales
//! are vectors, and nothing is summed across lanes. The GEMM (prefill)
//! keeps reading the file's own layout.
//!
//! Layout, per group of sixteen rows and super-block (`PACKED_BLOCK`
//! bytes, groups one after another, a group's super-blocks in order):
//! - `64 * w + 4 * r`: bytes `16 + 4w .. 20 + 4w` of row r's block (word
//!   `w = 8j + l` holds, in its low nibbles, elements `64j + 4l ..` of
//!   sub-block `2j`, in its high nibbles those of sub-block `2j + 1`);
//! - `SC + 16 * p + r`, `MN + 16 * p + r`: row r's scale and min of
//!   sub-block p;
//! - `D + 2 * r`, `DM + 2 * r`: row r's `d` and `dmin` (f16).
//!
//! Bits: each super-block's integer sums are exact and its value is the
//! scalar reference's `(d_w * d_a) * isum - (dmin_w * d_a) * summ`, added
//! in block order from +0.0, lane by lane: the same bits as every other
//! Q4_K path.

use std::arch::x86_64::*;

use super::packed_groups::{ahead_bytes, pack_groups, prefetch_line, prefetch_span};
use super::{read_f32, read_u32};
use crate::quant::kquant_scales::scales_mins;
use crate::quant::{q4_k, q8_k, QK_K};

/// Rows per group: the sixteen i32 lanes.
pub const GROUP_ROWS: usize = 16;
const SC: usize = 32 * 64;
const MN: usize = SC + 8 * 16;
const D: usize = MN + 8 * 16;
const DM: usize = D + 2 * GROUP_ROWS;
/// Bytes per group and super-block (the file's sixteen blocks take 2,304).
pub const PACKED_BLOCK: usize = DM + 2 * GROUP_ROWS;

/// Whether the CPU has what the kernel uses.
pub fn available() -> bool {
    super::available()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// Word `w` of the sixteen blocks' quants (bytes `16 + 4w ..`) into the
/// packed block's word `w` (`64 * w + 4 * r` for row r): four 16 x 8-word
/// transposes, where copying four bytes at a time made packing an 8B model
/// take seconds.
///
/// # Safety
/// AVX2 and AVX-512 F are available; every block holds `q4_k::BLOCK`
/// bytes and `dst` `PACKED_BLOCK`.
#[target_feature(enable = "avx2,avx512f")]
unsafe fn transpose_quants(blocks: &[&[u8]; GROUP_ROWS], dst: &mut [u8]) {
    for k in 0..4 {
        // SAFETY: bytes 16 + 32k .. 48 + 32k of each block.
        let v: [__m256i; GROUP_ROWS] = std::array::from_fn(|r| unsafe {
            _mm256_loadu_si256(blocks[r].as_ptr().add(16 + 32 * k) as *const __m256i)
        });
        for (j, t) in super::rows16_vnni::transpose(v).iter().enumerate() {
            // SAFETY: word 8k + j of the packed block.
            unsafe {
                _mm512_storeu_si512(dst.as_mut_ptr().add(64 * (8 * k + j)) as *mut __m512i, *t)
            };
        }
    }
}

/// Writes into `out` (`rows / 16 * cols / 256 * PACKED_BLOCK` bytes) the
/// packed form of a Q4_K matrix of `rows` (a multiple of 16) rows of
/// `cols` elements held in `data` (the file's layout).
pub fn pack(rows: usize, cols: usize, data: &[u8], out: &mut [u8]) {
    assert!(available(), "q4_k packing without AVX-512");
    let sizes = (QK_K, q4_k::BLOCK, PACKED_BLOCK);
    pack_groups("q4_k", sizes, rows, cols, data, out, |blocks, dst| {
        // SAFETY: AVX-512 F was checked above; every block holds
        // q4_k::BLOCK bytes and `dst` PACKED_BLOCK.
        unsafe { transpose_quants(blocks, dst) };
        for (r, b) in blocks.iter().enumerate() {
            let (sc, mn) = scales_mins(&b[4..16]);
            for p in 0..8 {
                dst[SC + 16 * p + r] = (sc >> (8 * p)) as u8;
                dst[MN + 16 * p + r] = (mn >> (8 * p)) as u8;
            }
            dst[D + 2 * r..D + 2 * r + 2].copy_from_slice(&b[0..2]);
            dst[DM + 2 * r..DM + 2 * r + 2].copy_from_slice(&b[2..4]);
        }
    });
}

/// `vpshufb` controls that turn sixteen bytes, broadcast to each 128-bit
/// lane, into row r's byte as two u16 in i32 lane r: (b_r, 0, b_r, 0).
#[target_feature(enable = "avx512f")]
fn dup_rows() -> __m512i {
    let c: [u8; 64] = std::array::from_fn(|j| {
        let r = 4 * (j / 16) + (j % 16) / 4;
        if j % 2 == 0 {
            r as u8
        } else {
            0x80
        }
    });
    // SAFETY: 64 bytes on the stack.
    unsafe { _mm512_loadu_si512(c.as_ptr() as *const __m512i) }
}

/// The sixteen rows of one group (`grp`: its `nb` packed super-blocks)
/// against `N` Q8_K activation rows; writes each token's sixteen values
/// to `out[t]`.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 F/BW/VL and VNNI are available; `grp` holds
/// `nb * PACKED_BLOCK` bytes and every `a[t]` `nb` Q8_K blocks.
/// Every `out[t]` has sixteen writable floats.
// `t` indexes several arrays (tokens' sums, pointers) at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pass<const N: usize>(nb: usize, grp: *const u8, a: [*const u8; N], out: [*mut f32; N]) {
    let m4 = _mm512_set1_epi8(0x0f);
    let zero = _mm512_setzero_si512();
    let dup = dup_rows();
    let mut acc = [_mm512_setzero_ps(); N];
    let ahead = ahead_bytes::<N>();
    for i in 0..nb {
        let blk = grp.wrapping_add(i * PACKED_BLOCK);
        prefetch_span(blk, ahead, SC, PACKED_BLOCK);
        let ab: [*const u8; N] = std::array::from_fn(|t| a[t].wrapping_add(i * q8_k::BLOCK));
        let bytes16 = |o: usize| {
            // SAFETY: 16 bytes of this packed block (o < PACKED_BLOCK - 16).
            _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(blk.add(o) as *const __m128i) })
        };
        let mut isum = [zero; N];
        for j in 0..4 {
            let (mut dlo, mut dhi) = ([zero; N], [zero; N]);
            for l in 0..8 {
                // SAFETY: word 8j + l of this packed block.
                let q = unsafe { _mm512_loadu_si512(blk.add(64 * (8 * j + l)) as *const __m512i) };
                prefetch_line(blk, ahead, 64 * (8 * j + l));
                let lo = _mm512_and_si512(q, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
                for t in 0..N {
                    // SAFETY: quants 64j + 4l.. and 64j + 32 + 4l.. of
                    // token t's block i.
                    let (xl, xh) = unsafe {
                        (
                            read_u32(ab[t].add(4 + 64 * j + 4 * l)),
                            read_u32(ab[t].add(36 + 64 * j + 4 * l)),
                        )
                    };
                    dlo[t] = _mm512_dpbusd_epi32(dlo[t], lo, _mm512_set1_epi32(xl as i32));
                    dhi[t] = _mm512_dpbusd_epi32(dhi[t], hi, _mm512_set1_epi32(xh as i32));
                }
            }
            let (sl, sh) = (bytes16(SC + 32 * j), bytes16(SC + 32 * j + 16));
            for t in 0..N {
                let s = _mm512_add_epi32(
                    _mm512_mullo_epi32(dlo[t], sl),
                    _mm512_mullo_epi32(dhi[t], sh),
                );
                isum[t] = _mm512_add_epi32(isum[t], s);
            }
        }
        // The mins against the activation's 16-sums: one `vpdpwssd` per
        // token and sub-block, row r's (m, m) as two i16 in its lane against
        // the token's two 16-sums of the sub-block as they lie in Q8_K (two
        // i16 at 260 + 4p), where a `vpmulld` (two micro-ops, on one port),
        // a broadcast of their scalar sum and an add took four. Integer
        // sums, no overflow (|m * 16-sum| <= 63 * 2048): the same value.
        let mut summ = [zero; N];
        for p in 0..8 {
            // SAFETY: the sixteen mins of sub-block p of this packed block.
            let mb = _mm512_broadcast_i32x4(unsafe {
                _mm_loadu_si128(blk.add(MN + 16 * p) as *const __m128i)
            });
            let mm = _mm512_shuffle_epi8(mb, dup);
            for t in 0..N {
                // SAFETY: 16-sums 2p and 2p + 1 of token t's block i.
                let pair = unsafe { read_u32(ab[t].add(260 + 4 * p)) };
                summ[t] = _mm512_dpwssd_epi32(summ[t], mm, _mm512_set1_epi32(pair as i32));
            }
        }
        // SAFETY: the sixteen d and dmin of this packed block.
        let (dw, dmin) = unsafe {
            (
                _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(D) as *const __m256i)),
                _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(DM) as *const __m256i)),
            )
        };
        for t in 0..N {
            // SAFETY: token t's block-i scale.
            let da = _mm512_set1_ps(unsafe { read_f32(ab[t]) });
            // The scalar reference's block value, lane by lane, to the bit.
            let v = _mm512_sub_ps(
                _mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum[t])),
                _mm512_mul_ps(_mm512_mul_ps(dmin, da), _mm512_cvtepi32_ps(summ[t])),
            );
            acc[t] = _mm512_add_ps(acc[t], v);
        }
    }
    for t in 0..N {
        // SAFETY: sixteen floats at each `out[t]` (caller's contract).
        unsafe { _mm512_storeu_ps(out[t], acc[t]) };
    }
}

super::packed_groups::q8k_packed_tile!("Q4_K");
