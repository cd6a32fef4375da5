//! The activation panel of the GEMM microkernels: up to eight Q8_0, Q8_1
//! or Q8_K rows interleaved so that one 32-byte load holds four consecutive
//! elements of each of the eight rows.
//!
//! Layout, per 32-element block `i` (Q8_0, Q8_1):
//! - quants: `quants[i * PANEL_BLOCK + j * 32 + c * 4 + e]` is element
//!   `4j + e` of row `c`, for groups `j < 8`;
//! - scales: `scales[i * PANEL_SCALES + c]` is row c's `d` and
//!   `scales[i * PANEL_SCALES + 8 + c]` its Q8_1 sum `s`, or for Q8_0 the
//!   integer sum of its 32 quants.
//!
//! Layout, per 256-element Q8_K super-block `i`: the block's 288 bytes
//! after `d` (256 quants, then 16 i16 group sums) are nine runs of 32
//! bytes, each interleaved like a Q8_0 block's quants:
//! - quants: `quants[i * KPANEL_BLOCK + j * 32 + c * 4 + e]` is byte
//!   `4 + 4j + e` of row c's block, so for `j < 64` element `4j + e`, and
//!   for `j = 64 + k` the group sums `2k` and `2k + 1` (one u32 per row);
//! - scales: `scales[i * KPANEL_SCALES + c]` is row c's f32 `d`.
//!
//! Rows past the end of a short group are zeros, so they add nothing and
//! their outputs are simply not read.

use super::{block, q8_0, q8_1, q8_k, GgmlType, GEMM_COLS, QK_K};

/// Panel bytes per 32-element block.
pub const PANEL_BLOCK: usize = 32 * GEMM_COLS;
/// Panel floats per 32-element block.
pub const PANEL_SCALES: usize = 2 * GEMM_COLS;
/// Q8_K panel bytes per 256-element super-block: 64 groups of quants and
/// the eight pairs of group sums.
pub const KPANEL_BLOCK: usize = 9 * 32 * GEMM_COLS;
/// Q8_K panel floats per super-block (each row's `d`).
pub const KPANEL_SCALES: usize = GEMM_COLS;

/// Whether `pack_panel` packs activations of format `act` (the others'
/// GEMM kernels read the activation rows directly).
pub fn has_panels(act: GgmlType) -> bool {
    matches!(act, GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8K)
}

/// Bytes and floats of one panel of rows of `n` elements in format `act`
/// ((0, 0) for formats without panels).
pub fn panel_sizes(act: GgmlType, n: usize) -> (usize, usize) {
    match act {
        GgmlType::Q8_0 | GgmlType::Q8_1 => (n / 32 * PANEL_BLOCK, n / 32 * PANEL_SCALES),
        GgmlType::Q8K => (n / QK_K * KPANEL_BLOCK, n / QK_K * KPANEL_SCALES),
        _ => (0, 0),
    }
}

/// Packs up to eight activation rows of `n` elements each (format `act`,
/// Q8_0, Q8_1 or Q8_K) into `quants` and `scales` (at least
/// `panel_sizes(act, n)` long). Other formats leave both untouched.
pub fn pack_panel(act: GgmlType, acts: &[&[u8]], n: usize, quants: &mut [u8], scales: &mut [f32]) {
    // Block bytes, offset of the interleaved payload, its 32-byte runs,
    // panel floats per block, blocks per row.
    let (bytes, first, runs, per, nb) = match act {
        GgmlType::Q8_0 => (q8_0::BLOCK, 2, 1, PANEL_SCALES, n / 32),
        GgmlType::Q8_1 => (q8_1::BLOCK, 4, 1, PANEL_SCALES, n / 32),
        GgmlType::Q8K => (q8_k::BLOCK, 4, 9, KPANEL_SCALES, n / QK_K),
        _ => return,
    };
    let (qlen, slen) = panel_sizes(act, n);
    let quants = &mut quants[..qlen];
    let scales = &mut scales[..slen];
    if acts.len() < GEMM_COLS {
        quants.fill(0);
    }
    scales.fill(0.0);
    let full = acts.len() >= GEMM_COLS && acts.iter().all(|a| a.len() >= nb * bytes);
    let pb = runs * PANEL_BLOCK;
    for (c, a) in acts.iter().enumerate().take(GEMM_COLS) {
        for (i, b) in a.chunks_exact(bytes).take(nb).enumerate() {
            match act {
                GgmlType::Q8K => scales[i * per + c] = block::f32_at(b, 0),
                _ => {
                    scales[i * per + c] = block::f16_at(b, 0);
                    scales[i * per + GEMM_COLS + c] = if act == GgmlType::Q8_1 {
                        block::f16_at(b, 2)
                    } else {
                        // The integer sum of the quants (at most 32 * 128 in
                        // magnitude, exact as f32), which the VNNI kernel
                        // needs for the signed weight formats' offsets.
                        b[2..34].iter().map(|&q| q as i8 as i32).sum::<i32>() as f32
                    };
                }
            }
            if full && cfg!(target_arch = "x86_64") && avx2::available() {
                continue; // transposed below, eight columns at once
            }
            let q = &b[first..first + 32 * runs];
            let dst = &mut quants[i * pb..(i + 1) * pb];
            for (j, four) in q.chunks_exact(4).enumerate() {
                dst[j * 32 + c * 4..j * 32 + c * 4 + 4].copy_from_slice(four);
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if full && avx2::available() {
        let rows: [*const u8; GEMM_COLS] = std::array::from_fn(|c| acts[c].as_ptr());
        // SAFETY: AVX2 was detected; every row holds nb blocks of `bytes`
        // (checked in `full`), each with `runs` 32-byte runs from `first`
        // (the format's layout), and `quants` nb * runs * PANEL_BLOCK bytes
        // (sliced above).
        unsafe { avx2::transpose_blocks(rows, bytes, first, runs, nb, quants.as_mut_ptr()) };
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{GEMM_COLS, PANEL_BLOCK};

    pub fn available() -> bool {
        is_x86_feature_detected!("avx2")
    }

    /// For each block: the eight rows' 32 quants (eight 4-byte groups each)
    /// as an 8x8 matrix of u32, transposed so that group j of every row is
    /// contiguous.
    ///
    /// # Safety
    /// AVX2 is available; each row holds `nb` blocks of `bytes`, each with
    /// `runs` runs of 32 bytes from `first`; `dst` holds
    /// `nb * runs * PANEL_BLOCK` bytes.
    #[target_feature(enable = "avx2")]
    pub unsafe fn transpose_blocks(
        rows: [*const u8; GEMM_COLS],
        bytes: usize,
        first: usize,
        runs: usize,
        nb: usize,
        dst: *mut u8,
    ) {
        for i in 0..nb * runs {
            let src = (i / runs) * bytes + first + (i % runs) * 32;
            // SAFETY: run i % runs of block i / runs of each row is in
            // bounds (caller's contract).
            let r: [__m256i; 8] = std::array::from_fn(|c| unsafe {
                _mm256_loadu_si256(rows[c].add(src) as *const __m256i)
            });
            // 32-bit, then 64-bit interleaves within 128-bit lanes, then
            // the lanes: out[j] holds group j of rows 0..8.
            let a0 = _mm256_unpacklo_epi32(r[0], r[1]);
            let a1 = _mm256_unpackhi_epi32(r[0], r[1]);
            let a2 = _mm256_unpacklo_epi32(r[2], r[3]);
            let a3 = _mm256_unpackhi_epi32(r[2], r[3]);
            let a4 = _mm256_unpacklo_epi32(r[4], r[5]);
            let a5 = _mm256_unpackhi_epi32(r[4], r[5]);
            let a6 = _mm256_unpacklo_epi32(r[6], r[7]);
            let a7 = _mm256_unpackhi_epi32(r[6], r[7]);
            let b0 = _mm256_unpacklo_epi64(a0, a2);
            let b1 = _mm256_unpackhi_epi64(a0, a2);
            let b2 = _mm256_unpacklo_epi64(a1, a3);
            let b3 = _mm256_unpackhi_epi64(a1, a3);
            let b4 = _mm256_unpacklo_epi64(a4, a6);
            let b5 = _mm256_unpackhi_epi64(a4, a6);
            let b6 = _mm256_unpacklo_epi64(a5, a7);
            let b7 = _mm256_unpackhi_epi64(a5, a7);
            let out = [
                _mm256_permute2x128_si256::<0x20>(b0, b4),
                _mm256_permute2x128_si256::<0x20>(b1, b5),
                _mm256_permute2x128_si256::<0x20>(b2, b6),
                _mm256_permute2x128_si256::<0x20>(b3, b7),
                _mm256_permute2x128_si256::<0x31>(b0, b4),
                _mm256_permute2x128_si256::<0x31>(b1, b5),
                _mm256_permute2x128_si256::<0x31>(b2, b6),
                _mm256_permute2x128_si256::<0x31>(b3, b7),
            ];
            for (j, v) in out.iter().enumerate() {
                // SAFETY: group j of block i is inside `dst`.
                unsafe {
                    _mm256_storeu_si256(dst.add(i * PANEL_BLOCK + j * 32) as *mut __m256i, *v)
                };
            }
        }
    }
}
