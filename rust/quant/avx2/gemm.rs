//! The prefill GEMM microkernel for the 32-element block formats: one weight
//! row against eight activation columns at a time.
//!
//! Why this shape: a weight block is decoded once into a register and used
//! by eight `maddubs` whose activation operand comes straight from memory.
//! The eight per-column block scales `d_w * d_a[c]` come from one vector
//! multiply against the columns' f32 scales (packed once per column group
//! by the caller), and the Q8_1 minimum terms `m_w * s_a[c]` of all eight
//! columns are one multiply and one add into one register.
//!
//! Every (row, column) result is bit-identical to the single-dot kernels
//! (`dot_rc`, and ggml's `vec_dot`): the same products `d_w * d_a`, one
//! 8-lane FMA accumulator per column in block order, the same horizontal
//! sum, and the minimum terms rounded then added in block order. So the
//! prefill and decode paths share their matrix arithmetic exactly, and both
//! match llama.cpp's. (Folding the `maddubs` lanes as i16 first was measured
//! at +33% kernel throughput on Zen 1, but changes the rounding order and so
//! loses that parity; we keep parity.)

use std::arch::x86_64::*;

use super::{block_sum, hsum, load, Block32};
use crate::quant::GEMM_COLS;

const C: usize = GEMM_COLS;

/// `out[r * 8 + c]` = row `r` of `w_rows` . column `c` of `acts`.
///
/// `scales[i * 16 + c]` is column c's f32 scale in block i and
/// `scales[i * 16 + 8 + c]` its Q8_1 sum `s` (unused without a minimum).
///
/// # Safety
/// AVX2, FMA and F16C are available; every row holds `nb` weight blocks,
/// every column `nb` activation blocks, `scales` `nb * 16` floats and `out`
/// `w_rows.len() * 8` floats.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_rows<F: Block32>(
    nb: usize,
    w_rows: &[&[u8]],
    acts: &[*const u8; C],
    scales: *const f32,
    out: *mut f32,
) {
    for (r, w) in w_rows.iter().enumerate() {
        let w = w.as_ptr();
        let mut acc = [_mm256_setzero_ps(); C];
        let mut mins = _mm256_setzero_ps();
        let mut prod = [0f32; C];
        for i in 0..nb {
            // SAFETY: block i of the row is in bounds (caller's contract).
            let bw = unsafe { w.add(i * F::W) };
            // SAFETY: as above; `scales` holds 16 floats per block.
            let (qw, dm, da) = unsafe {
                (
                    F::quants(bw),
                    F::scales(bw),
                    _mm256_loadu_ps(scales.add(i * 16)),
                )
            };
            // SAFETY: `prod` is 8 floats; each column then broadcasts its
            // scale from memory, a load rather than a shuffle.
            unsafe {
                _mm256_storeu_ps(
                    prod.as_mut_ptr(),
                    _mm256_mul_ps(_mm256_broadcastss_ps(dm), da),
                )
            };
            if F::MIN {
                let m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
                // SAFETY: as above.
                let s = unsafe { _mm256_loadu_ps(scales.add(i * 16 + 8)) };
                mins = _mm256_add_ps(mins, _mm256_mul_ps(m, s));
            }
            for (c, a) in acc.iter_mut().enumerate() {
                // SAFETY: block i of column c is in bounds; its 32 quants end it.
                let qa = unsafe { load(acts[c].add(i * F::A + F::A - 32)) };
                *a = _mm256_fmadd_ps(_mm256_set1_ps(prod[c]), block_sum::<F>(qw, qa), *a);
            }
        }
        let mut m = [0f32; C];
        // SAFETY: `m` is 8 floats.
        unsafe { _mm256_storeu_ps(m.as_mut_ptr(), mins) };
        for c in 0..C {
            // SAFETY: features enabled on this function; out holds 8 floats per row.
            unsafe {
                let s = hsum(acc[c]);
                *out.add(r * C + c) = if F::MIN { s + m[c] } else { s };
            }
        }
    }
}

/// Safe entry: checks every length the kernel reads, then runs it.
pub(super) fn gemm<F: Block32>(
    n: usize,
    w_rows: &[&[u8]],
    acts: &[&[u8]; C],
    scales: &[f32],
    out: &mut [f32],
) {
    let nb = n / 32;
    assert!(
        w_rows.iter().all(|w| w.len() >= nb * F::W)
            && acts.iter().all(|a| a.len() >= nb * F::A)
            && scales.len() >= nb * 16
            && out.len() >= w_rows.len() * C,
        "gemm operand too short"
    );
    let ptrs = acts.map(|a| a.as_ptr());
    // SAFETY: the table holding this function is installed only after AVX2,
    // FMA and F16C were detected; the assert bounds every read and write.
    unsafe { gemm_rows::<F>(nb, w_rows, &ptrs, scales.as_ptr(), out.as_mut_ptr()) }
}
