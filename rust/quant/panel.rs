//! The activation panel of the GEMM microkernels: up to eight Q8_0 or Q8_1
//! rows interleaved so that one 32-byte load holds four consecutive
//! elements of each of the eight rows.
//!
//! Layout, per 32-element block `i`:
//! - quants: `quants[i * PANEL_BLOCK + j * 32 + c * 4 + e]` is element
//!   `4j + e` of row `c`, for groups `j < 8`;
//! - scales: `scales[i * PANEL_SCALES + c]` is row c's `d` and
//!   `scales[i * PANEL_SCALES + 8 + c]` its Q8_1 sum `s` (0 for Q8_0).
//!
//! Rows past the end of a short group are zeros, so they add nothing and
//! their outputs are simply not read.

use super::{block, q8_0, q8_1, GgmlType, GEMM_COLS};

/// Panel bytes per 32-element block.
pub const PANEL_BLOCK: usize = 32 * GEMM_COLS;
/// Panel floats per 32-element block.
pub const PANEL_SCALES: usize = 2 * GEMM_COLS;

/// Whether `pack_panel` packs activations of format `act` (the others'
/// GEMM kernels read the activation rows directly).
pub fn has_panels(act: GgmlType) -> bool {
    matches!(act, GgmlType::Q8_0 | GgmlType::Q8_1)
}

/// Packs up to eight activation rows of `nb` blocks each (format `act`,
/// Q8_0 or Q8_1) into `quants` (`nb * PANEL_BLOCK` bytes) and `scales`
/// (`nb * PANEL_SCALES` floats). Other formats leave both untouched.
pub fn pack_panel(act: GgmlType, acts: &[&[u8]], nb: usize, quants: &mut [u8], scales: &mut [f32]) {
    let (bytes, has_s) = match act {
        GgmlType::Q8_0 => (q8_0::BLOCK, false),
        GgmlType::Q8_1 => (q8_1::BLOCK, true),
        _ => return,
    };
    let quants = &mut quants[..nb * PANEL_BLOCK];
    let scales = &mut scales[..nb * PANEL_SCALES];
    if acts.len() < GEMM_COLS {
        quants.fill(0);
    }
    scales.fill(0.0);
    let full = acts.len() >= GEMM_COLS && acts.iter().all(|a| a.len() >= nb * bytes);
    for (c, a) in acts.iter().enumerate().take(GEMM_COLS) {
        for (i, b) in a.chunks_exact(bytes).take(nb).enumerate() {
            scales[i * PANEL_SCALES + c] = block::f16_at(b, 0);
            if has_s {
                scales[i * PANEL_SCALES + GEMM_COLS + c] = block::f16_at(b, 2);
            }
            if full && cfg!(target_arch = "x86_64") && avx2::available() {
                continue; // transposed below, eight columns at once
            }
            let q = &b[bytes - 32..];
            let dst = &mut quants[i * PANEL_BLOCK..(i + 1) * PANEL_BLOCK];
            for (j, four) in q.chunks_exact(4).enumerate() {
                dst[j * 32 + c * 4..j * 32 + c * 4 + 4].copy_from_slice(four);
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if full && avx2::available() {
        let rows: [*const u8; GEMM_COLS] = std::array::from_fn(|c| acts[c].as_ptr());
        // SAFETY: AVX2 was detected; every row holds nb blocks of `bytes`
        // (checked in `full`) and `quants` nb * PANEL_BLOCK bytes (sliced
        // above).
        unsafe { avx2::transpose_blocks(rows, bytes, nb, quants.as_mut_ptr()) };
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
    /// AVX2 is available; each row holds `nb` blocks of `bytes` (quants in
    /// the last 32); `dst` holds `nb * PANEL_BLOCK` bytes.
    #[target_feature(enable = "avx2")]
    pub unsafe fn transpose_blocks(
        rows: [*const u8; GEMM_COLS],
        bytes: usize,
        nb: usize,
        dst: *mut u8,
    ) {
        for i in 0..nb {
            // SAFETY: block i of each row is in bounds (caller's contract).
            let r: [__m256i; 8] = std::array::from_fn(|c| unsafe {
                _mm256_loadu_si256(rows[c].add(i * bytes + bytes - 32) as *const __m256i)
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
