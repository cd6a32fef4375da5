//! Gated feed-forward activations.
//!
//! SwiGLU's exponential is our own: Cody-Waite reduction to
//! `r in [-ln2/2, ln2/2]`, a degree-6 polynomial (fitted for relative
//! error, about 1 ulp), and the power of two put into the exponent bits.
//! The AVX2 path and its scalar twin perform the same IEEE operations in
//! the same order (FMAs included), so they agree bit for bit, and libm's
//! `expf` (one call per element, a third of a batched decode step's serial
//! time before this) is out of the loop.

use crate::threadpool::{SharedMut, ThreadPool};

/// Elements below which one thread does the whole product: a dispatch
/// costs more than it saves.
const PARALLEL_FROM: usize = 1 << 15;

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
/// `e^x` stays finite and normal for `x` in this range; outside it the
/// gate's sigmoid is 0 or 1 to f32 precision anyway.
const X_MIN: f32 = -87.0;
const X_MAX: f32 = 88.0;

/// `gate = silu(gate) * up`, in place (SwiGLU), on the pool when large.
pub fn swiglu(pool: &ThreadPool, gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let f = best();
    if n < PARALLEL_FROM || pool.n_threads() == 1 {
        f(&mut gate[..n], &up[..n]);
        return;
    }
    let per = n.div_ceil(pool.n_threads() * 4).next_multiple_of(8);
    let g = SharedMut::new(&mut gate[..n]);
    pool.run(n.div_ceil(per), |c| {
        let (a, b) = (c * per, ((c + 1) * per).min(n));
        // SAFETY: chunk c alone owns elements a..b.
        f(unsafe { g.slice(a, b - a) }, &up[a..b]);
    });
}

type SwigluFn = fn(&mut [f32], &[f32]);

fn best() -> SwigluFn {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        return avx2::swiglu;
    }
    swiglu_scalar
}

/// `e^x` for `x` in `[X_MIN, X_MAX]` (callers clamp).
#[inline]
fn exp_scalar(x: f32) -> f32 {
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let mut p = C[4];
    for &c in C[..4].iter().rev() {
        p = p.mul_add(r, c);
    }
    let e = p.mul_add(r * r, r) + 1.0;
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// The scalar twin of the AVX2 kernel (same operations, same bits).
pub fn swiglu_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        // `min`/`max` spelled as the SIMD instructions behave.
        let x = -*g;
        let x = if x < X_MAX { x } else { X_MAX };
        let x = if x > X_MIN { x } else { X_MIN };
        *g = *g / (1.0 + exp_scalar(x)) * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{C, LN2_HI, LN2_LO, LOG2E, X_MAX, X_MIN};

    pub fn available() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    pub fn swiglu(gate: &mut [f32], up: &[f32]) {
        let n = gate.len().min(up.len());
        let n8 = n / 8 * 8;
        // SAFETY: `available()` was true when this kernel was picked; the
        // kernel touches elements 0..n8 of both slices only.
        unsafe { swiglu8(gate.as_mut_ptr(), up.as_ptr(), n8) };
        super::swiglu_scalar(&mut gate[n8..n], &up[n8..n]);
    }

    /// # Safety
    /// AVX2 and FMA are available; `g` and `u` hold `n` floats, n % 8 == 0.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn swiglu8(g: *mut f32, u: *const f32, n: usize) {
        let mut i = 0;
        while i < n {
            // SAFETY: i + 8 <= n (caller's contract).
            let (gv, uv) = unsafe { (_mm256_loadu_ps(g.add(i)), _mm256_loadu_ps(u.add(i))) };
            let x = _mm256_sub_ps(_mm256_setzero_ps(), gv);
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
            let e = _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
            let s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(g.add(i), _mm256_mul_ps(s, uv)) };
            i += 8;
        }
    }
}

/// `gate = gelu_tanh(gate) * up`, in place (GeGLU, used by Gemma).
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let t = (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh();
        *g = 0.5 * x * (1.0 + t) * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn exp_is_within_two_ulp_of_f64() {
        let mut x = X_MIN;
        while x <= X_MAX {
            let got = exp_scalar(x) as f64;
            let want = (x as f64).exp();
            assert!(
                ((got - want) / want).abs() < 2.0 * f32::EPSILON as f64,
                "{x}: {got} {want}"
            );
            x += 0.0137;
        }
    }

    #[test]
    fn swiglu_matches_its_definition_and_simd_its_scalar_twin() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for n in [0, 1, 7, 8, 9, 100, 1536] {
            let gate: Vec<f32> = (0..n)
                .map(|i| match i % 50 {
                    0 => -200.0,
                    1 => 200.0,
                    2 => 0.0,
                    _ => rng.random_range(-12.0..12.0),
                })
                .collect();
            let up: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0..3.0)).collect();
            let mut fast = gate.clone();
            best()(&mut fast, &up);
            let mut slow = gate.clone();
            swiglu_scalar(&mut slow, &up);
            assert_eq!(
                fast.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                slow.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
            for ((&g, &u), &y) in gate.iter().zip(&up).zip(&fast) {
                let want = g as f64 / (1.0 + (-g as f64).exp()) * u as f64;
                assert!(
                    (y as f64 - want).abs() <= 1e-6 * want.abs() + 1e-30,
                    "{g} {u}: {y} {want}"
                );
            }
        }
    }

    #[test]
    fn pooled_swiglu_equals_one_thread() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        let n = PARALLEL_FROM * 2 + 13;
        let gate: Vec<f32> = (0..n).map(|_| rng.random_range(-8.0..8.0)).collect();
        let up: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
        let (mut a, mut b) = (gate.clone(), gate);
        swiglu(&ThreadPool::new(2), &mut a, &up);
        swiglu(&ThreadPool::new(1), &mut b, &up);
        assert_eq!(a, b);
    }
}
