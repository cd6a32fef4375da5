//! Q8_0 weights repacked at load time for decode on AVX-512 VNNI: sixteen
//! rows' blocks stored already transposed, so the kernel streams one
//! sequential run of bytes and does no shuffling.
//!
//! Why: Q8_0 is what llama.cpp's Q4_K_M files use for a tied embedding
//! that is also the output head (Gemma-3's is 178 MB of its 246). The
//! row tile (`rows16_vnni.rs`) reads sixteen rows' blocks from sixteen
//! places and transposes them with two dozen shuffles per block, and on
//! two Zen 4 cores held the head to about 25 GB/s, three quarters of what
//! a plain read gets. Here the transpose is done once, when packing: a
//! block of sixteen rows is eight 64-byte words, eight `vpdpbusd`, one
//! f16-to-f32 conversion and one FMA. The layout takes exactly the file's
//! bytes (sixteen blocks of 34).
//!
//! Layout, per group of sixteen rows and block of 32 elements
//! (`PACKED_BLOCK` bytes, groups one after another, a group's blocks in
//! order):
//! - `64 * j + 4 * r`: quants `4j .. 4j + 4` of row r, plus 128 (the
//!   unsigned form `vpdpbusd` takes; the kernel subtracts 128 times the
//!   activation's block sum);
//! - `SC + 2 * r`: row r's scale (f16).
//!
//! Bits: per block, `fma(isum, d_w * d_a, acc)` from +0.0 in block order,
//! lane by lane, the row tile's arithmetic: the same bits as every other
//! Q8_0 path.

use std::arch::x86_64::*;

use super::packed_groups::{
    ahead_bytes, pack_groups, prefetch_ahead, run_groups, sides, BlockSide, GroupPass,
};
use super::{read_u32, Block32};
use crate::quant::q8_0;

/// Rows per group: the sixteen i32 lanes.
pub const GROUP_ROWS: usize = 16;
const QK: usize = 32;
const SC: usize = 8 * 64;
/// Bytes per group and block: the file's sixteen blocks take the same.
pub const PACKED_BLOCK: usize = SC + 2 * GROUP_ROWS;

/// Whether the CPU has what the kernel uses.
pub fn available() -> bool {
    super::q4k_packed::available()
}

/// Writes into `out` (`rows / 16 * cols / 32 * PACKED_BLOCK` bytes) the
/// packed form of a Q8_0 matrix of `rows` (a multiple of 16) rows of
/// `cols` elements held in `data` (the file's layout).
pub fn pack(rows: usize, cols: usize, data: &[u8], out: &mut [u8]) {
    assert!(available(), "q8_0 packing without AVX-512");
    let sizes = (QK, q8_0::BLOCK, PACKED_BLOCK);
    pack_groups("q8_0", sizes, rows, cols, data, out, |blocks, dst| {
        // SAFETY: AVX-512 F was checked above; every block holds
        // q8_0::BLOCK bytes and `dst` PACKED_BLOCK.
        unsafe { transpose_block(blocks, dst) };
        for (r, b) in blocks.iter().enumerate() {
            dst[SC + 2 * r..SC + 2 * r + 2].copy_from_slice(&b[0..2]);
        }
    });
}

/// The sixteen blocks' unsigned quants, transposed into words 0..8.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F are available; every block holds
/// `q8_0::BLOCK` bytes and `dst` `PACKED_BLOCK`.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn transpose_block(blocks: &[&[u8]; GROUP_ROWS], dst: &mut [u8]) {
    // SAFETY: each block's 34 bytes are readable (caller's contract).
    let q: [__m256i; GROUP_ROWS] =
        std::array::from_fn(|r| unsafe { super::q8_0::Q8_0::uquants(blocks[r].as_ptr()) });
    for (j, t) in super::rows16_vnni::transpose(q).iter().enumerate() {
        // SAFETY: word j of the packed block is within `dst`.
        unsafe { _mm512_storeu_si512(dst.as_mut_ptr().add(64 * j) as *mut __m512i, *t) };
    }
}

/// The sixteen rows of one group (`grp`: its `nb` packed blocks) against
/// `N` Q8_0 activation rows whose blocks' scalars are `side[t]`; writes each
/// token's sixteen values to `out[t]`.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 F/VL and VNNI are available; `grp` holds
/// `nb * PACKED_BLOCK` bytes, every `a[t]` `nb` Q8_0 blocks and every
/// `side[t]` `nb` entries.
/// Every `out[t]` has sixteen writable floats.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn pass<const N: usize>(
    nb: usize,
    grp: *const u8,
    a: [*const u8; N],
    side: [*const BlockSide; N],
    out: [*mut f32; N],
) {
    let mut acc = [_mm512_setzero_ps(); N];
    let ahead = ahead_bytes::<N>();
    for i in 0..nb {
        let blk = grp.wrapping_add(i * PACKED_BLOCK);
        prefetch_ahead(blk, ahead, PACKED_BLOCK);
        let ab: [*const u8; N] = std::array::from_fn(|t| a[t].wrapping_add(i * q8_0::BLOCK));
        // Two partial sums per token over even and odd words: the chains
        // interleave (integer sums, so the split cannot change them).
        let mut s = [[_mm512_setzero_si512(); 2]; N];
        for j in 0..8 {
            // SAFETY: word j of this packed block.
            let q = unsafe { _mm512_loadu_si512(blk.add(64 * j) as *const __m512i) };
            for t in 0..N {
                // SAFETY: quants 4j..4j + 4 of token t's block i.
                let four = unsafe { read_u32(ab[t].add(2 + 4 * j)) };
                s[t][j % 2] = _mm512_dpbusd_epi32(s[t][j % 2], q, _mm512_set1_epi32(four as i32));
            }
        }
        // SAFETY: the sixteen scales of this packed block.
        let dw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(blk.add(SC) as *const __m256i) });
        for t in 0..N {
            // SAFETY: token t's block-i scalars.
            let sd = unsafe { &*side[t].add(i) };
            let isum = _mm512_sub_epi32(
                _mm512_add_epi32(s[t][0], s[t][1]),
                _mm512_set1_epi32(sd.off),
            );
            let prod = _mm512_mul_ps(dw, _mm512_set1_ps(sd.d));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), prod, acc[t]);
        }
    }
    for t in 0..N {
        // SAFETY: sixteen floats at each `out[t]` (caller's contract).
        unsafe { _mm512_storeu_ps(out[t], acc[t]) };
    }
}

/// Groups `g0..g1` of a packed matrix of `n`-element rows against every
/// Q8_0 activation row: `outs[t][(g - g0) * 16 + r]` is row `16g + r`
/// against token t. `side` is the table `side` (below) filled for `acts`.
pub fn tile(
    n: usize,
    packed: &[u8],
    groups: (usize, usize),
    acts: &[&[u8]],
    side: &[BlockSide],
    outs: &mut [&mut [f32]],
) {
    assert!(available(), "packed Q8_0 kernel without AVX-512 VNNI");
    let nb = n / QK;
    assert!(
        n.is_multiple_of(QK)
            && acts.iter().all(|a| a.len() >= nb * q8_0::BLOCK)
            && side.len() == acts.len() * nb,
        "packed tile operand too short"
    );
    // SAFETY: the features were asserted above.
    unsafe { run_groups::<Q8_0Packed>(nb, packed, groups, acts, side, outs) }
}

/// The scalars `tile` reads of each Q8_0 activation block (its scale, and
/// its quant sum times the unsigned form's offset), rows of `n` elements.
pub fn side(n: usize, acts: &[&[u8]], out: &mut Vec<BlockSide>) {
    sides::<super::q8_0::Q8_0>(acts, n / QK, out)
}

/// The Q8_0 layout's pass, for `run_groups`.
struct Q8_0Packed;

impl GroupPass for Q8_0Packed {
    const PACKED: usize = PACKED_BLOCK;
    unsafe fn pass<const N: usize>(
        nb: usize,
        grp: *const u8,
        a: [*const u8; N],
        side: [*const BlockSide; N],
        out: [*mut f32; N],
    ) {
        // SAFETY: the trait's contract is `pass`'s.
        unsafe { pass::<N>(nb, grp, a, side, out) }
    }
}
