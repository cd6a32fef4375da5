//! Gated feed-forward activations.

/// `gate = silu(gate) * up`, in place (SwiGLU).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
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
