//! TQ2_0 weights repacked at load time for decode on AVX-512 VNNI:
//! sixteen rows interleaved so that one 64-byte load holds the same four
//! value bytes of each of them, as `q4k_packed.rs` lays out Q4_K.
//!
//! Why: a ternary matrix is a quarter of a byte a weight, so decode
//! should run at the memory's pace; the row kernel spends its time
//! unpacking one row's 2-bit values and summing across lanes.
//!
//! Layout, per group of sixteen rows and super-block (`PACKED_BLOCK`
//! bytes, the file's sixteen blocks' 1,056 exactly):
//! - `64 * (8 h + k) + 4 * r`: bytes `32 h + 4k .. 32 h + 4k + 4` of row
//!   r's values (bits `2l .. 2l + 2` of byte `m` of half `h` are element
//!   `128 h + 32 l + m`);
//! - `D + 2 * r`: row r's `d` (f16).
//!
//! Arithmetic: the stored values `q` (0..3) are `vpdpbusd`'s unsigned
//! operand; the weight is `q - 1`, so the block integer is the dot less
//! the sum of the token's 256 activations (Q8_K's 16-sums): the scalar
//! reference's exact integer, whose value `(d_w * d_a) * isum` adds in
//! block order from +0.0, lane by lane. The same bits as every TQ2_0 path.

use std::arch::x86_64::*;

use super::packed_groups::{ahead_bytes, pack_groups, prefetch_line, prefetch_span};
use super::{read_f32, read_u32};
use crate::quant::{q8_k, tq2_0, QK_K};

/// Rows per group: the sixteen i32 lanes.
pub const GROUP_ROWS: usize = 16;
const D: usize = 16 * 64;
/// Bytes per group and super-block.
pub const PACKED_BLOCK: usize = D + 2 * GROUP_ROWS;

/// Whether the CPU has what the kernel uses.
pub fn available() -> bool {
    super::q4k_packed::available()
}

/// Writes into `out` (`rows / 16 * cols / 256 * PACKED_BLOCK` bytes) the
/// packed form of a TQ2_0 matrix of `rows` (a multiple of 16) rows of
/// `cols` elements held in `data` (the file's layout).
pub fn pack(rows: usize, cols: usize, data: &[u8], out: &mut [u8]) {
    assert!(available(), "tq2_0 packing without AVX-512");
    let sizes = (QK_K, tq2_0::BLOCK, PACKED_BLOCK);
    pack_groups("tq2_0", sizes, rows, cols, data, out, |blocks, dst| {
        for h in 0..2 {
            // SAFETY: AVX-512 F was checked above; bytes 32h .. 32h + 32 of
            // each block, and words 8h .. 8h + 8 of `dst`.
            unsafe {
                let v: [__m256i; GROUP_ROWS] = std::array::from_fn(|r| {
                    _mm256_loadu_si256(blocks[r].as_ptr().add(32 * h) as *const __m256i)
                });
                for (k, t) in super::rows16_vnni::transpose(v).iter().enumerate() {
                    _mm512_storeu_si512(dst.as_mut_ptr().add(64 * (8 * h + k)) as *mut __m512i, *t);
                }
            }
        }
        for (r, b) in blocks.iter().enumerate() {
            dst[D + 2 * r..D + 2 * r + 2].copy_from_slice(&b[64..66]);
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
    let m2 = _mm512_set1_epi8(3);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); N];
    let ahead = ahead_bytes::<N>();
    for i in 0..nb {
        let blk = grp.wrapping_add(i * PACKED_BLOCK);
        prefetch_span(blk, ahead, D, PACKED_BLOCK);
        let ab: [*const u8; N] = std::array::from_fn(|t| a[t].wrapping_add(i * q8_k::BLOCK));
        // Four chains a token (one per 2-bit field): integer sums, so the
        // split cannot change them.
        let mut dot = [[zero; 4]; N];
        for h in 0..2 {
            for k in 0..8 {
                let w = 8 * h + k;
                // SAFETY: word w of this packed block.
                let q = unsafe { _mm512_loadu_si512(blk.add(64 * w) as *const __m512i) };
                prefetch_line(blk, ahead, 64 * w);
                let v = [
                    _mm512_and_si512(q, m2),
                    _mm512_and_si512(_mm512_srli_epi16::<2>(q), m2),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(q), m2),
                    _mm512_and_si512(_mm512_srli_epi16::<6>(q), m2),
                ];
                for t in 0..N {
                    for (l, vl) in v.iter().enumerate() {
                        // SAFETY: quants 128h + 32l + 4k.. of token t's block i.
                        let x = unsafe { read_u32(ab[t].add(4 + 128 * h + 32 * l + 4 * k)) };
                        dot[t][l] =
                            _mm512_dpbusd_epi32(dot[t][l], *vl, _mm512_set1_epi32(x as i32));
                    }
                }
            }
        }
        // SAFETY: the sixteen d of this packed block.
        let dw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(blk.add(D) as *const __m256i) });
        for t in 0..N {
            // SAFETY: token t's block i: its scale and its sixteen 16-sums.
            let (da, sum) = unsafe {
                let s: i32 = (0..16)
                    .map(|g| {
                        i16::from_le_bytes([*ab[t].add(260 + 2 * g), *ab[t].add(261 + 2 * g)])
                            as i32
                    })
                    .sum();
                (_mm512_set1_ps(read_f32(ab[t])), s)
            };
            let d = dot[t];
            let isum = _mm512_sub_epi32(
                _mm512_add_epi32(_mm512_add_epi32(d[0], d[1]), _mm512_add_epi32(d[2], d[3])),
                _mm512_set1_epi32(sum),
            );
            // The scalar reference's block value, lane by lane, to the bit.
            let v = _mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum));
            acc[t] = _mm512_add_ps(acc[t], v);
        }
    }
    for t in 0..N {
        // SAFETY: sixteen floats at each `out[t]` (caller's contract).
        unsafe { _mm512_storeu_ps(out[t], acc[t]) };
    }
}

super::packed_groups::q8k_packed_tile!("TQ2_0");
