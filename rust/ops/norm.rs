//! RMSNorm: `x / sqrt(mean(x^2) + eps) * weight`.

/// Normalizes each `dim`-length row of `x` into `out`, scaled by `weight`.
/// `weight_offset` is added to the weight (Gemma stores `w - 1`).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, weight_offset: f32, out: &mut [f32]) {
    let dim = weight.len();
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let ss: f64 = xr.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let scale = 1.0 / ((ss / dim as f64) as f32 + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * scale * (w + weight_offset);
        }
    }
}

/// In-place variant for per-head norms (Gemma-3 and Qwen-3 q/k norms).
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32, weight_offset: f32) {
    let dim = weight.len();
    for xr in x.chunks_exact_mut(dim) {
        let ss: f64 = xr.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let scale = 1.0 / ((ss / dim as f64) as f32 + eps).sqrt();
        for (v, &w) in xr.iter_mut().zip(weight) {
            *v = *v * scale * (w + weight_offset);
        }
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
}
