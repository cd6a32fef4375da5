//! The state-space models' recurrent steps for one token: the causal
//! depthwise convolution over the last `d_conv` inputs of each channel, and
//! the selective state-space update, Mamba-2's with one scalar decay per
//! head, Mamba-1's with one decay per channel and state. Written as ggml
//! evaluates them (same operation order, f32 throughout).

/// `softplus(x)`, linear above 20 as ggml computes it.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// One token through the convolution. `state` holds, per channel, the
/// previous `d_conv - 1` inputs (oldest first) and is shifted to include
/// `input`; `out[c] = silu(sum_i window[c][i] * w[c][i] + bias[c])`.
pub fn conv_step(
    state: &mut [f32],
    input: &[f32],
    w: &[f32],
    bias: &[f32],
    d_conv: usize,
    out: &mut [f32],
) {
    causal_conv_step(state, input, w, d_conv, out);
    for (o, &b) in out.iter_mut().zip(bias) {
        let v = *o + b;
        *o = v / (1.0 + (-v).exp());
    }
}

/// The convolution alone, without bias or activation (LFM2's short
/// convolution): `out[c] = sum_i window[c][i] * w[c][i]`, summed oldest
/// input first as ggml's `ssm_conv` does.
pub fn causal_conv_step(
    state: &mut [f32],
    input: &[f32],
    w: &[f32],
    d_conv: usize,
    out: &mut [f32],
) {
    let keep = d_conv - 1;
    for (c, (&x, o)) in input.iter().zip(out.iter_mut()).enumerate() {
        let st = &mut state[c * keep..(c + 1) * keep];
        let wc = &w[c * d_conv..(c + 1) * d_conv];
        let mut sum = 0f32;
        for i in 0..keep {
            sum += st[i] * wc[i];
        }
        sum += x * wc[keep];
        if keep > 0 {
            st.copy_within(1.., 0);
            st[keep - 1] = x;
        }
        *o = sum;
    }
}

/// The shape of one SSM update.
pub struct ScanShape {
    pub n_head: usize,
    pub head_dim: usize,
    pub d_state: usize,
    pub n_group: usize,
}

/// One token through the state-space update. `x` is `n_head x head_dim`,
/// `dt` the per-head step (bias added), `a` the per-head decay rate
/// (negative), `b` and `c` are `n_group x d_state`. Updates `state`
/// (`n_head x head_dim x d_state`) and writes `y` (`n_head x head_dim`).
#[allow(clippy::too_many_arguments)]
pub fn scan_step(
    sh: &ScanShape,
    state: &mut [f32],
    x: &[f32],
    dt: &[f32],
    a: &[f32],
    b: &[f32],
    c: &[f32],
    y: &mut [f32],
) {
    let (hd, ds) = (sh.head_dim, sh.d_state);
    let heads_per_group = sh.n_head / sh.n_group;
    for h in 0..sh.n_head {
        let dt_sp = softplus(dt[h]);
        let da = (dt_sp * a[h]).exp();
        let g = h / heads_per_group;
        let (bg, cg) = (&b[g * ds..(g + 1) * ds], &c[g * ds..(g + 1) * ds]);
        for i in 0..hd {
            let ii = h * hd + i;
            let x_dt = x[ii] * dt_sp;
            let s = &mut state[ii * ds..(ii + 1) * ds];
            let mut sum = 0f32;
            for k in 0..ds {
                let v = s[k] * da + bg[k] * x_dt;
                sum += v * cg[k];
                s[k] = v;
            }
            y[ii] = sum;
        }
    }
}

/// Mamba-1's update for one token. Every channel `i` of `x` (`d_inner`)
/// has its own step `softplus(dt[i])` and its own decay rates `a[i]`
/// (`d_state` each, negative), so the decay `exp(dt * a)` is taken per
/// state; `b` and `c` (`d_state`) are shared by every channel. Updates
/// `state` (`d_inner x d_state`) and writes `y` (`d_inner`).
pub fn scan_step_mamba1(
    state: &mut [f32],
    x: &[f32],
    dt: &[f32],
    a: &[f32],
    b: &[f32],
    c: &[f32],
    y: &mut [f32],
) {
    let ds = b.len();
    let rows = state
        .chunks_exact_mut(ds)
        .zip(a.chunks_exact(ds))
        .zip(x.iter().zip(dt).zip(y.iter_mut()));
    for ((s, ai), ((&xi, &dti), yi)) in rows {
        let dt_sp = softplus(dti);
        let x_dt = xi * dt_sp;
        let mut sum = 0f32;
        for k in 0..ds {
            let v = s[k] * (dt_sp * ai[k]).exp() + b[k] * x_dt;
            sum += v * c[k];
            s[k] = v;
        }
        *yi = sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn convolution_slides_its_window() {
        // Two channels, kernel 3: the state keeps the last two inputs.
        let w = [1.0, 2.0, 3.0, 0.5, 0.0, -1.0];
        let bias = [0.0, 0.0];
        let mut state = vec![0f32; 4];
        let mut out = [0f32; 2];
        let silu = |v: f32| v / (1.0 + (-v).exp());
        conv_step(&mut state, &[1.0, 2.0], &w, &bias, 3, &mut out);
        assert_eq!(state, [0.0, 1.0, 0.0, 2.0]);
        assert!((out[0] - silu(3.0)).abs() < 1e-6);
        assert!((out[1] - silu(-2.0)).abs() < 1e-6);
        conv_step(&mut state, &[4.0, 8.0], &w, &bias, 3, &mut out);
        assert_eq!(state, [1.0, 4.0, 2.0, 8.0]);
        assert!((out[0] - silu(2.0 + 12.0)).abs() < 1e-5);
        assert!((out[1] - silu(0.0 - 8.0)).abs() < 1e-6);
    }

    #[test]
    fn the_short_convolution_is_linear_and_keeps_its_last_inputs() {
        // LFM2's: no bias, no activation, oldest tap first.
        let w = [1.0, 2.0, 3.0, 0.5, 0.0, -1.0];
        let mut state = vec![0f32; 4];
        let mut out = [0f32; 2];
        causal_conv_step(&mut state, &[1.0, 2.0], &w, 3, &mut out);
        assert_eq!(
            (state.as_slice(), out),
            (&[0.0, 1.0, 0.0, 2.0][..], [3.0, -2.0])
        );
        causal_conv_step(&mut state, &[4.0, -8.0], &w, 3, &mut out);
        assert_eq!(
            (state.as_slice(), out),
            (&[1.0, 4.0, 2.0, -8.0][..], [14.0, 8.0])
        );
        causal_conv_step(&mut state, &[0.0, 0.0], &w, 3, &mut out);
        assert_eq!(out, [1.0 + 8.0, 1.0]);
    }

    #[test]
    fn scan_matches_the_recurrence_in_f64() {
        let sh = ScanShape {
            n_head: 4,
            head_dim: 2,
            d_state: 3,
            n_group: 2,
        };
        let mut state = vec![0f32; 4 * 2 * 3];
        let mut want = vec![0f64; state.len()];
        let a = [-0.5f32, -1.0, -2.0, -0.25];
        for t in 0..5 {
            let f = |i: usize| ((i * 7 + t * 3) % 11) as f32 / 5.0 - 1.0;
            let x: Vec<f32> = (0..8).map(f).collect();
            let dt: Vec<f32> = (0..4).map(|i| f(i + 20)).collect();
            let b: Vec<f32> = (0..6).map(|i| f(i + 40)).collect();
            let c: Vec<f32> = (0..6).map(|i| f(i + 60)).collect();
            let mut y = vec![0f32; 8];
            scan_step(&sh, &mut state, &x, &dt, &a, &b, &c, &mut y);
            for h in 0..4 {
                let sp = (1.0 + (dt[h] as f64).exp()).ln();
                let da = (sp * a[h] as f64).exp();
                let g = h / 2;
                for i in 0..2 {
                    let ii = h * 2 + i;
                    let mut sum = 0f64;
                    for k in 0..3 {
                        let v = want[ii * 3 + k] * da + b[g * 3 + k] as f64 * x[ii] as f64 * sp;
                        want[ii * 3 + k] = v;
                        sum += v * c[g * 3 + k] as f64;
                    }
                    assert!((y[ii] as f64 - sum).abs() < 1e-5, "t={t} {ii}");
                }
            }
        }
    }

    #[test]
    fn the_mamba1_scan_decays_each_state_at_its_own_rate() {
        // Three channels, four states: checked against the recurrence in
        // f64 over a few tokens, with decays that differ per state.
        let (di, ds) = (3, 4);
        let a: Vec<f32> = (0..di * ds).map(|i| -0.25 * (1 + i % 7) as f32).collect();
        let mut state = vec![0f32; di * ds];
        let mut want = vec![0f64; di * ds];
        for t in 0..6 {
            let f = |i: usize| ((i * 5 + t * 7) % 13) as f32 / 6.0 - 1.0;
            let x: Vec<f32> = (0..di).map(f).collect();
            let dt: Vec<f32> = (0..di).map(|i| f(i + 30)).collect();
            let b: Vec<f32> = (0..ds).map(|i| f(i + 50)).collect();
            let c: Vec<f32> = (0..ds).map(|i| f(i + 70)).collect();
            let mut y = vec![0f32; di];
            scan_step_mamba1(&mut state, &x, &dt, &a, &b, &c, &mut y);
            for i in 0..di {
                let sp = (1.0 + (dt[i] as f64).exp()).ln();
                let mut sum = 0f64;
                for k in 0..ds {
                    let j = i * ds + k;
                    let v = want[j] * (sp * a[j] as f64).exp() + b[k] as f64 * x[i] as f64 * sp;
                    want[j] = v;
                    sum += v * c[k] as f64;
                }
                assert!((y[i] as f64 - sum).abs() < 1e-5, "t={t} i={i}");
            }
        }
        for (s, w) in state.iter().zip(&want) {
            assert!((*s as f64 - w).abs() < 1e-5);
        }
    }
}
