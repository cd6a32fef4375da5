//! F32, F16 (F16C) and BF16 weights against f32 activations: four
//! independent FMA accumulators, 32 elements per step.

use std::arch::x86_64::*;

use super::hsum;
use crate::quant::float::{bf16_to_f32, f16_to_f32, f32_elem};

/// Eight weights at element `i` widened to f32.
trait Wide {
    const BYTES: usize;
    unsafe fn load8(p: *const u8, i: usize) -> __m256;
    fn one(w: &[u8], i: usize) -> f32;
}

struct F32;
struct F16;
struct Bf16;

impl Wide for F32 {
    const BYTES: usize = 4;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8, i: usize) -> __m256 {
        // SAFETY: callers keep i + 8 within the row.
        unsafe { _mm256_loadu_ps(p.add(4 * i) as *const f32) }
    }
    fn one(w: &[u8], i: usize) -> f32 {
        f32_elem(w, i)
    }
}

impl Wide for F16 {
    const BYTES: usize = 2;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8, i: usize) -> __m256 {
        // SAFETY: callers keep i + 8 within the row.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i) as *const __m128i)) }
    }
    fn one(w: &[u8], i: usize) -> f32 {
        f16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]]))
    }
}

impl Wide for Bf16 {
    const BYTES: usize = 2;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8, i: usize) -> __m256 {
        // SAFETY: callers keep i + 8 within the row.
        let h = unsafe { _mm_loadu_si128(p.add(2 * i) as *const __m128i) };
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    }
    fn one(w: &[u8], i: usize) -> f32 {
        bf16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]]))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot<T: Wide>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (pw, pa) = (w.as_ptr(), a.as_ptr() as *const f32);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, s) in acc.iter_mut().enumerate() {
            let j = i + 8 * k;
            // SAFETY: j + 8 <= n and both rows hold n elements.
            unsafe { *s = _mm256_fmadd_ps(T::load8(pw, j), _mm256_loadu_ps(pa.add(j)), *s) };
        }
        i += 32;
    }
    while i + 8 <= n {
        // SAFETY: as above.
        unsafe { acc[0] = _mm256_fmadd_ps(T::load8(pw, i), _mm256_loadu_ps(pa.add(i)), acc[0]) };
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for j in i..n {
        s += T::one(w, j) * f32_elem(a, j);
    }
    s
}

macro_rules! entry {
    ($name:ident, $t:ty) => {
        pub fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            assert!(
                w.len() >= n * <$t>::BYTES && a.len() >= n * 4,
                "row too short"
            );
            // SAFETY: features detected at install time; lengths asserted above.
            unsafe { dot::<$t>(n, w, a) }
        }
    };
}

entry!(vec_dot_f32, F32);
entry!(vec_dot_f16, F16);
entry!(vec_dot_bf16, Bf16);
