//! RMSNorm, `x / sqrt(mean(x^2) + eps) * weight`, and LayerNorm,
//! `(x - mean) / sqrt(var + eps) * weight + bias`.
//!
//! The sum of squares is accumulated in f64 over sixteen lanes (four
//! 4-lane accumulators) combined in a fixed order; the AVX2 path and its
//! scalar twin perform the same f64 operations in the same order, so they
//! agree bit for bit. A single sequential f64 chain cost a microsecond per
//! row, twice per layer for every row of a batched decode step.

/// Sum of `x[i]^2` in f64, in the lane order described above.
fn sum_squares(x: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: AVX2 was detected.
        return unsafe { avx2::sum_squares(x) };
    }
    sum_squares_scalar(x)
}

/// The scalar twin of `avx2::sum_squares`.
fn sum_squares_scalar(x: &[f32]) -> f64 {
    let n16 = x.len() / 16 * 16;
    let mut acc = [[0f64; 4]; 4];
    for c in x[..n16].chunks_exact(16) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, v) in a.iter_mut().enumerate() {
                let e = c[4 * j + l] as f64;
                *v += e * e;
            }
        }
    }
    let v: [f64; 4] = std::array::from_fn(|l| (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]));
    let mut s = (v[0] + v[1]) + (v[2] + v[3]);
    for &e in &x[n16..] {
        s += e as f64 * e as f64;
    }
    s
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    pub fn available() -> bool {
        is_x86_feature_detected!("avx2")
    }

    /// # Safety
    /// AVX2 is available.
    #[target_feature(enable = "avx2")]
    pub unsafe fn sum_squares(x: &[f32]) -> f64 {
        let n16 = x.len() / 16 * 16;
        let p = x.as_ptr();
        let mut acc = [_mm256_setzero_pd(); 4];
        let mut i = 0;
        while i < n16 {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: i + 16 <= len, so these 4 floats are in bounds.
                let v = _mm256_cvtps_pd(unsafe { _mm_loadu_ps(p.add(i + 4 * j)) });
                *a = _mm256_add_pd(*a, _mm256_mul_pd(v, v));
            }
            i += 16;
        }
        let v = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
        let mut l = [0f64; 4];
        // SAFETY: `l` holds 4 doubles.
        unsafe { _mm256_storeu_pd(l.as_mut_ptr(), v) };
        let mut s = (l[0] + l[1]) + (l[2] + l[3]);
        for &e in &x[n16..] {
            s += e as f64 * e as f64;
        }
        s
    }
}

/// Normalizes each `dim`-length row of `x` into `out`, scaled by `weight`.
/// `weight_offset` is added to the weight (Gemma stores `w - 1`).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, weight_offset: f32, out: &mut [f32]) {
    let dim = weight.len();
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let scale = 1.0 / ((sum_squares(xr) / dim as f64) as f32 + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * scale * (w + weight_offset);
        }
    }
}

/// In-place variant for per-head norms (Gemma-3 and Qwen-3 q/k norms).
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32, weight_offset: f32) {
    let dim = weight.len();
    for xr in x.chunks_exact_mut(dim) {
        let scale = 1.0 / ((sum_squares(xr) / dim as f64) as f32 + eps).sqrt();
        for (v, &w) in xr.iter_mut().zip(weight) {
            *v = *v * scale * (w + weight_offset);
        }
    }
}

/// LayerNorm of each `dim`-length row of `x` into `out` (`dim` is the
/// weight's length). Mean and variance are summed in f64, as ggml does,
/// and the bias, when there is one, is added after the weight.
pub fn layer_norm(x: &[f32], weight: &[f32], bias: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        or.copy_from_slice(xr);
        layer_norm_row(or, weight, bias, eps);
    }
}

/// In-place variant for per-head norms (Command-R q/k norms).
pub fn layer_norm_inplace(x: &mut [f32], weight: &[f32], bias: Option<&[f32]>, eps: f32) {
    for xr in x.chunks_exact_mut(weight.len()) {
        layer_norm_row(xr, weight, bias, eps);
    }
}

fn layer_norm_row(x: &mut [f32], weight: &[f32], bias: Option<&[f32]>, eps: f32) {
    let dim = x.len() as f64;
    let mean = (x.iter().map(|&v| v as f64).sum::<f64>() / dim) as f32;
    let mut var = 0f64;
    for v in x.iter_mut() {
        *v -= mean;
        var += (*v * *v) as f64;
    }
    let scale = 1.0 / ((var / dim) as f32 + eps).sqrt();
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = *v * scale * w;
    }
    if let Some(b) = bias {
        x.iter_mut().zip(b).for_each(|(v, &c)| *v += c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_rms_after_norm() {
        let x = [3.0f32, -4.0, 0.0, 5.0];
        let w = [1.0f32; 4];
        let mut o = [0f32; 4];
        rms_norm(&x, &w, 0.0, 0.0, &mut o);
        let rms = (o.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-5);
        let mut y = x;
        rms_norm_inplace(&mut y, &w, 0.0, 0.0);
        assert_eq!(y, o);
    }

    #[test]
    fn layer_norm_matches_f64_definition() {
        let x: Vec<f32> = (0..24).map(|i| ((i * 7 % 11) as f32 - 4.0) * 1.5).collect();
        let w: Vec<f32> = (0..8).map(|i| 0.5 + i as f32 * 0.25).collect();
        let b: Vec<f32> = (0..8).map(|i| i as f32 * -0.1).collect();
        let mut out = vec![0f32; 24];
        layer_norm(&x, &w, Some(&b), 1e-5, &mut out);
        for (xr, or) in x.chunks(8).zip(out.chunks(8)) {
            let m = xr.iter().map(|&v| v as f64).sum::<f64>() / 8.0;
            let var = xr.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / 8.0;
            for i in 0..8 {
                let want = (xr[i] as f64 - m) / (var + 1e-5).sqrt() * w[i] as f64 + b[i] as f64;
                assert!((or[i] as f64 - want).abs() < 1e-5, "{} {want}", or[i]);
            }
        }
        let mut y = x.clone();
        layer_norm_inplace(&mut y, &w, Some(&b), 1e-5);
        assert_eq!(y, out);
    }

    #[test]
    fn sum_of_squares_simd_equals_scalar_twin_and_f64_reference() {
        let mut x = 0.3f32;
        for n in [0usize, 1, 15, 16, 17, 64, 576, 1000] {
            let v: Vec<f32> = (0..n)
                .map(|i| {
                    x = (x * 3.7 + i as f32 * 0.01).fract() * 2.0 - 1.0;
                    x * 40.0
                })
                .collect();
            let (fast, slow) = (sum_squares(&v), sum_squares_scalar(&v));
            assert_eq!(fast.to_bits(), slow.to_bits(), "n={n}");
            let exact: f64 = v.iter().map(|&e| e as f64 * e as f64).sum();
            assert!((fast - exact).abs() <= 1e-12 * exact.max(1.0), "n={n}");
        }
    }
}
