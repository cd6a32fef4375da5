//! Gated feed-forward activations.
//!
//! SwiGLU uses our own exponential (`ops::exp`), whose AVX2 form and scalar
//! twin agree bit for bit; libm's `expf`, one call per element, was a third
//! of a batched decode step's serial time.

use crate::ops::exp::exp;
use crate::threadpool::{SharedMut, ThreadPool};
use half::f16;

/// Elements below which one thread does the whole product: a dispatch
/// costs more than it saves.
const PARALLEL_FROM: usize = 1 << 15;

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

/// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`): the gate is capped at
/// `limit` from above, the up projection clamped to `[-limit, limit]`, and
/// `x * sigmoid(alpha x) * (up + 1)` written over the gate.
pub fn swiglu_oai(gate: &mut [f32], up: &[f32], alpha: f32, limit: f32) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(limit);
        let y = u.clamp(-limit, limit);
        *g = x / (1.0 + (alpha * -x).exp()) * (y + 1.0);
    }
}

type SwigluFn = fn(&mut [f32], &[f32]);

fn best() -> SwigluFn {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        return avx2::swiglu;
    }
    swiglu_scalar
}

/// The scalar twin of the AVX2 kernel (same operations, same bits).
pub fn swiglu_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp(-*g)) * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    pub use crate::ops::exp::avx2::available;
    use crate::ops::exp::avx2::exp8;

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
            // -g as the scalar twin forms it: a sign flip, not 0 - g.
            let e = exp8(_mm256_xor_ps(gv, _mm256_set1_ps(-0.0)));
            let s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(g.add(i), _mm256_mul_ps(s, uv)) };
            i += 8;
        }
    }
}

/// GELU, tanh approximation, in f32 as ggml writes it.
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044_715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

/// GELU of every f16 value, rounded to f16: ggml evaluates GELU by
/// rounding its input to f16 and looking it up here, so we do the same to
/// compute the same function.
fn gelu_table() -> &'static [u16] {
    static TABLE: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| f16::from_f32(gelu_tanh(f16::from_bits(b).to_f32())).to_bits())
            .collect()
    })
}

/// GELU through the f16 table, linear above 10 and zero below -10.
fn gelu_lookup(table: &[u16], x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        f16::from_bits(table[f16::from_f32(x).to_bits() as usize]).to_f32()
    }
}

/// `gate = gelu(gate) * up`, in place (GeGLU, used by Gemma).
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    let t = gelu_table();
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu_lookup(t, *g) * u;
    }
}

/// `x = gelu(x)`, in place (the ungated MLP of StarCoder2).
pub fn gelu(x: &mut [f32]) {
    let t = gelu_table();
    x.iter_mut().for_each(|v| *v = gelu_lookup(t, *v));
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Both clamps bite: a gate above the limit counts as the limit, an up
    /// beyond either side as that side.
    #[test]
    fn swiglu_oai_clamps_gate_above_and_up_both_sides() {
        let (alpha, limit) = (1.702f32, 7.0f32);
        let gate = [-3.0f32, 0.5, 9.0, 7.0, 2.0];
        let up = [0.25f32, -8.0, 1.0, 12.0, -0.5];
        let mut got = gate;
        swiglu_oai(&mut got, &up, alpha, limit);
        let want = |g: f32, u: f32| {
            let x = g.min(limit) as f64;
            let y = u.max(-limit).min(limit) as f64;
            (x / (1.0 + (-alpha as f64 * x).exp()) * (y + 1.0)) as f32
        };
        for i in 0..gate.len() {
            let w = want(gate[i], up[i]);
            assert!(
                (got[i] - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{i}: {} vs {w}",
                got[i]
            );
        }
        // 9 is capped at 7: the same output as a gate of 7 with that up.
        let mut capped = [9.0f32, 7.0];
        swiglu_oai(&mut capped, &[1.0, 1.0], alpha, limit);
        assert_eq!(capped[0], capped[1]);
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
    fn gelu_is_the_tanh_approximation_at_f16_resolution() {
        for i in -400..=400 {
            let x = i as f32 * 0.03;
            let mut y = [x];
            gelu(&mut y);
            let xf = x as f64;
            let want = 0.5 * xf * (1.0 + (0.797_884_560_8 * (xf + 0.044_715 * xf.powi(3))).tanh());
            // The input and the result are rounded to f16.
            assert!(
                (y[0] as f64 - want).abs() <= 2e-3 * (1.0 + want.abs()),
                "{x}: {} {want}",
                y[0]
            );
        }
        let (mut a, up) = ([12.0f32, -12.0], [2.0f32, 3.0]);
        geglu(&mut a, &up);
        assert_eq!(a, [24.0, 0.0]);
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
