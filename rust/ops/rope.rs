//! Rotary position embeddings with ggml's two pair orderings and
//! linear / YaRN context scaling.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeOrder {
    /// Adjacent pairs `(x[2i], x[2i+1])` (llama; GGUF converters permute
    /// q/k weights so this ordering is right for them).
    Normal,
    /// Split halves `(x[i], x[i + n/2])` (GPT-NeoX, Qwen2, Gemma).
    Neox,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    Linear {
        factor: f32,
    },
    Yarn {
        factor: f32,
        original_ctx: u32,
        beta_fast: f32,
        beta_slow: f32,
        attn_factor: f32,
        /// `rope.scaling.yarn_log_multiplier` (0 when absent): divides the
        /// magnitude correction by `1 + 0.1 log_mul ln(factor)`.
        log_mul: f32,
    },
}

/// Per-model rotary tables: inverse frequencies and YaRN ramp, computed once.
#[derive(Debug, Clone)]
pub struct Rope {
    pub order: RopeOrder,
    /// Leading dimensions of each head that rotate; the rest pass through.
    pub n_dims: usize,
    inv_freq: Vec<f32>,
    /// Fraction of extrapolation per pair (YaRN); empty otherwise.
    ramp: Vec<f32>,
    freq_scale: f32,
    mscale: f32,
    /// Per-pair frequency divisors (LongRoPE's `rope_factors_*`); empty
    /// when the model has none.
    factors: Vec<f32>,
}

impl Rope {
    pub fn new(order: RopeOrder, n_dims: usize, base: f32, scaling: &RopeScaling) -> Self {
        let half = n_dims / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| base.powf(-2.0 * i as f32 / n_dims as f32))
            .collect();
        let (freq_scale, ramp, mscale) = match *scaling {
            RopeScaling::None => (1.0, Vec::new(), 1.0),
            RopeScaling::Linear { factor } => (1.0 / factor.max(1e-6), Vec::new(), 1.0),
            RopeScaling::Yarn {
                factor,
                original_ctx,
                beta_fast,
                beta_slow,
                attn_factor,
                log_mul,
            } => {
                let fs = 1.0 / factor.max(1e-6);
                let corr = |n_rot: f32| {
                    n_dims as f32
                        * (original_ctx as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
                        / (2.0 * base.ln())
                };
                let low = corr(beta_fast).floor().max(0.0);
                let high = corr(beta_slow).ceil().min(n_dims as f32 - 1.0);
                let ramp = (0..half)
                    .map(|i| {
                        let y = (i as f32 - low) / (high - low).max(0.001);
                        1.0 - y.clamp(0.0, 1.0)
                    })
                    .collect();
                let mut m = attn_factor * (1.0 + 0.1 * (1.0 / fs).ln());
                if log_mul != 0.0 && factor > 1.0 {
                    m /= 0.1 * log_mul * factor.ln() + 1.0;
                }
                (fs, ramp, m)
            }
        };
        Rope {
            order,
            n_dims,
            inv_freq,
            ramp,
            freq_scale,
            mscale,
            factors: Vec::new(),
        }
    }

    /// The same rotation with each pair's frequency divided by its factor
    /// and the cos/sin scaled by `attn_factor` (Phi-3's LongRoPE).
    pub fn with_factors(mut self, factors: Vec<f32>, attn_factor: f32) -> Self {
        self.factors = factors;
        self.mscale *= attn_factor;
        self
    }

    /// Cos/sin for every rotating pair at position `pos`, into `cs`
    /// (length `n_dims`: cos then sin interleaved per pair).
    pub fn angles(&self, pos: usize, cs: &mut [f32]) {
        for i in 0..self.inv_freq.len() {
            let theta = self.theta(i, pos as f32);
            cs[2 * i] = theta.cos() * self.mscale;
            cs[2 * i + 1] = theta.sin() * self.mscale;
        }
    }

    /// Cos/sin that turn a key rotated for position `p` into the same key
    /// rotated for `p + delta` (a context shift moves cached keys). Every
    /// pair's angle is linear in the position, so this is the rotation of
    /// `delta` positions without the magnitude factor, which the key
    /// already carries.
    pub fn shift_angles(&self, delta: i64, cs: &mut [f32]) {
        for i in 0..self.inv_freq.len() {
            let theta = self.theta(i, delta as f32);
            cs[2 * i] = theta.cos();
            cs[2 * i + 1] = theta.sin();
        }
    }

    /// Angle of pair `i` at position `pos`.
    fn theta(&self, i: usize, pos: f32) -> f32 {
        let mut extrap = pos * self.inv_freq[i];
        if let Some(&d) = self.factors.get(i) {
            extrap /= d;
        }
        let interp = extrap * self.freq_scale;
        match self.ramp.get(i) {
            Some(&mix) => interp * (1.0 - mix) + extrap * mix,
            None => interp,
        }
    }

    /// Rotates every head (`head_dim` long) in `x` using precomputed `cs`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, cs: &[f32]) {
        let half = self.n_dims / 2;
        for head in x.chunks_exact_mut(head_dim) {
            match self.order {
                RopeOrder::Normal => {
                    for i in 0..half {
                        let (c, s) = (cs[2 * i], cs[2 * i + 1]);
                        let (a, b) = (head[2 * i], head[2 * i + 1]);
                        head[2 * i] = a * c - b * s;
                        head[2 * i + 1] = a * s + b * c;
                    }
                }
                RopeOrder::Neox => {
                    for i in 0..half {
                        let (c, s) = (cs[2 * i], cs[2 * i + 1]);
                        let (a, b) = (head[i], head[i + half]);
                        head[i] = a * c - b * s;
                        head[i + half] = a * s + b * c;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_preserves_norm_and_position_zero_is_identity() {
        for order in [RopeOrder::Normal, RopeOrder::Neox] {
            let r = Rope::new(order, 8, 10000.0, &RopeScaling::None);
            let mut cs = vec![0f32; 8];
            let x0: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
            r.angles(0, &mut cs);
            let mut x = x0.clone();
            r.apply(&mut x, 8, &cs);
            assert_eq!(x, x0);
            r.angles(17, &mut cs);
            r.apply(&mut x, 8, &cs);
            let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
            assert!((n(&x) - n(&x0)).abs() < 1e-3);
            assert_ne!(x, x0);
        }
    }

    /// A key rotated at `p` and then shifted by `delta` is the key rotated
    /// at `p + delta`, for both orders, YaRN and per-pair factors.
    #[test]
    fn shift_rotation_moves_a_key_to_its_new_position() {
        let yarn = RopeScaling::Yarn {
            factor: 4.0,
            original_ctx: 64,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attn_factor: 1.0,
            log_mul: 0.0,
        };
        for order in [RopeOrder::Normal, RopeOrder::Neox] {
            for scaling in [
                RopeScaling::None,
                RopeScaling::Linear { factor: 2.0 },
                yarn.clone(),
            ] {
                let r = Rope::new(order, 16, 10000.0, &scaling)
                    .with_factors((0..8).map(|i| 1.0 + i as f32 * 0.25).collect(), 1.0);
                let x0: Vec<f32> = (0..32).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
                let (mut cs, mut sh) = (vec![0f32; 16], vec![0f32; 16]);
                for (p, delta) in [(100usize, -37i64), (40, -20), (5, 3)] {
                    let mut shifted = x0.clone();
                    r.angles(p, &mut cs);
                    r.apply(&mut shifted, 16, &cs);
                    r.shift_angles(delta, &mut sh);
                    r.apply(&mut shifted, 16, &sh);
                    let mut direct = x0.clone();
                    r.angles((p as i64 + delta) as usize, &mut cs);
                    r.apply(&mut direct, 16, &cs);
                    for (a, b) in shifted.iter().zip(&direct) {
                        assert!(
                            (a - b).abs() < 2e-3,
                            "{order:?} {scaling:?} p={p}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn linear_scaling_halves_angles() {
        let plain = Rope::new(RopeOrder::Normal, 4, 10000.0, &RopeScaling::None);
        let lin = Rope::new(
            RopeOrder::Normal,
            4,
            10000.0,
            &RopeScaling::Linear { factor: 2.0 },
        );
        let (mut a, mut b) = (vec![0f32; 4], vec![0f32; 4]);
        plain.angles(10, &mut a);
        lin.angles(20, &mut b);
        assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-5));
    }
}
