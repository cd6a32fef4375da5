//! Our single-precision exponential, in a scalar and an AVX2 form that
//! perform the same IEEE operations in the same order (FMAs included), so
//! they agree bit for bit and a kernel may mix them (SIMD body, scalar
//! tail) without its results depending on where the tail starts.
//!
//! Cody-Waite reduction to `r in [-ln2/2, ln2/2]`, a degree-6 polynomial
//! fitted for relative error (about 1 ulp), and the power of two put into
//! the exponent bits. Inputs are clamped to `[X_MIN, X_MAX]`, where the
//! result is finite and normal: below, `e^x` is below 1.7e-38 and adds
//! nothing next to 1 (SwiGLU) or to a softmax's largest term (which is 1).

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `n * LN2_HI` is exact for every `n` we use.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `(e^r - 1 - r) / r^2` on `[-ln2/2, ln2/2]`, lowest degree first.
const C: [f32; 5] = [
    0.499_999_88,
    0.166_665_06,
    0.041_669_764,
    0.008_370_347,
    0.001_374_621_9,
];
pub const X_MIN: f32 = -87.0;
pub const X_MAX: f32 = 88.0;

/// `e^x`, `x` clamped to `[X_MIN, X_MAX]`.
#[inline]
pub fn exp(x: f32) -> f32 {
    // `min`/`max` spelled as the SIMD instructions behave.
    let x = if x < X_MAX { x } else { X_MAX };
    let x = if x > X_MIN { x } else { X_MIN };
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let mut p = C[4];
    for &c in C[..4].iter().rev() {
        p = p.mul_add(r, c);
    }
    let e = p.mul_add(r * r, r) + 1.0;
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use std::arch::x86_64::*;

    use super::{C, LN2_HI, LN2_LO, LOG2E, X_MAX, X_MIN};

    pub fn available() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// Eight lanes of [`super::exp`], bit for bit.
    ///
    /// # Safety
    /// AVX2 and FMA are available.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp8(x: __m256) -> __m256 {
        let x = _mm256_max_ps(
            _mm256_min_ps(x, _mm256_set1_ps(X_MAX)),
            _mm256_set1_ps(X_MIN),
        );
        let nf = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        );
        let r = _mm256_fmadd_ps(nf, _mm256_set1_ps(-LN2_HI), x);
        let r = _mm256_fmadd_ps(nf, _mm256_set1_ps(-LN2_LO), r);
        let mut p = _mm256_set1_ps(C[4]);
        for &c in C[..4].iter().rev() {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let e = _mm256_add_ps(
            _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(nf),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(e, _mm256_castsi256_ps(bits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_of_f64() {
        let mut x = X_MIN;
        while x <= X_MAX {
            let got = exp(x) as f64;
            let want = (x as f64).exp();
            assert!(
                ((got - want) / want).abs() < 2.0 * f32::EPSILON as f64,
                "{x}: {got} {want}"
            );
            x += 0.0137;
        }
        assert_eq!(exp(-1000.0), exp(X_MIN));
        assert_eq!(exp(1000.0), exp(X_MAX));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_exp_equals_scalar_bit_for_bit() {
        use std::arch::x86_64::*;
        if !avx2::available() {
            return;
        }
        let mut x = -100.0f32;
        while x < 100.0 {
            let xs: [f32; 8] = std::array::from_fn(|i| x + i as f32 * 0.001_37);
            let mut out = [0f32; 8];
            // SAFETY: AVX2 and FMA were detected above; both arrays hold 8 floats.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), avx2::exp8(_mm256_loadu_ps(xs.as_ptr()))) };
            for (a, b) in xs.iter().zip(&out) {
                assert_eq!(exp(*a).to_bits(), b.to_bits(), "{a}");
            }
            x += 0.0173;
        }
    }
}
