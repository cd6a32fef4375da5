//! ggml's scale searches, shared by the block quantizers.
//!
//! Each one keeps ggml's floating-point operation order exactly: sums run
//! left to right from zero, `a*b*c` is `(a*b)*c`, an integer meets a float
//! by conversion, and no product is fused into an add. Reordering any of
//! these moves a rounding and changes bytes of the output.

/// Values below this count as an all-zero group.
pub const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: rounds half to even by adding 1.5 * 2^23 and
/// reading the low mantissa bits (valid for |v| < 2^22).
#[inline]
pub fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// The index of the level of `values` (sorted, `values.len()` a power of
/// two) nearest to `x`, ties to the upper one: `x` takes level `i` once
/// `2x` reaches `values[i-1] + values[i]` (both sides exact).
#[inline]
pub fn best_index_int8(values: &[i8], x: f32) -> usize {
    let x2 = x + x;
    let mut idx = 0;
    let mut step = values.len() >> 1;
    while step > 0 {
        let j = idx + step;
        if x2 >= (values[j - 1] as i32 + values[j] as i32) as f32 {
            idx = j;
        }
        step >>= 1;
    }
    idx
}

/// Which weight `make_qx_quants` gives element `x` without an importance
/// vector.
#[inline]
fn rmse_weight(rmse_type: i32, x: f32) -> f32 {
    match rmse_type {
        1 => x * x,
        2 => 1.0,
        3 => x.abs(),
        _ => x.abs().sqrt(),
    }
}

/// Symmetric levels `-nmax..nmax-1`: the scale that best fits `x` over
/// 19 candidates around `nmax / max`; writes `L[i] = level + nmax`.
pub fn make_qx_quants(
    nmax: i32,
    x: &[f32],
    l_out: &mut [i8],
    rmse_type: i32,
    qw: Option<&[f32]>,
) -> f32 {
    let n = x.len();
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let mut iscale = -nmaxf / max;
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    if rmse_type == 0 {
        for i in 0..n {
            l_out[i] = (nmax + clamp(nearest_int(iscale * x[i]))) as i8;
        }
        return 1.0 / iscale;
    }
    let (rmse_type, return_early) = if rmse_type < 0 {
        (-rmse_type, true)
    } else {
        (rmse_type, false)
    };
    let weight = |i: usize| match qw {
        Some(q) => q[i],
        None => rmse_weight(rmse_type, x[i]),
    };
    let mut sumlx = 0f32;
    let mut suml2 = 0f32;
    for i in 0..n {
        let l = clamp(nearest_int(iscale * x[i]));
        l_out[i] = (l + nmax) as i8;
        let w = weight(i);
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 {
            0.5 * (scale + 1.0 / iscale)
        } else {
            1.0 / iscale
        };
    }
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmaxf + 0.1f32 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..n {
            let l = clamp(nearest_int(iscale * x[i])) as f32;
            let w = weight(i);
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                l_out[i] = (nmax + clamp(nearest_int(iscale * x[i]))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Q3_K's symmetric search: with `do_rmse`, levels are refined one at a
/// time for up to five rounds under weights `x^2`.
pub fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8], do_rmse: bool) -> f32 {
    let n = x.len();
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    if do_rmse {
        let mut sumlx = 0f32;
        let mut suml2 = 0f32;
        for i in 0..n {
            let l = clamp(nearest_int(iscale * x[i]));
            l_out[i] = l as i8;
            let w = x[i] * x[i];
            sumlx += w * x[i] * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        for _ in 0..5 {
            let mut n_changed = 0;
            for i in 0..n {
                let w = x[i] * x[i];
                let li = l_out[i] as f32;
                let mut slx = sumlx - w * x[i] * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let new_l = clamp(nearest_int(x[i] * sl2 / slx));
                    if new_l != l_out[i] as i32 {
                        let nl = new_l as f32;
                        slx += w * x[i] * nl;
                        sl2 += w * nl * nl;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            l_out[i] = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for l in l_out[..n].iter_mut() {
            *l += nmax as i8;
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for i in 0..n {
        l_out[i] = (clamp(nearest_int(iscale * x[i])) + nmax) as i8;
    }
    1.0 / iscale
}

/// Shared start of the asymmetric searches: min (at most 0), max, and the
/// weighted sums `sum w` and `sum w x`.
fn min_max_sums(x: &[f32], weight: impl Fn(usize) -> f32) -> (f32, f32, f32, f32) {
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weight(0);
    let mut sum_x = sum_w * x[0];
    for i in 1..x.len() {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weight(i);
        sum_w += w;
        sum_x += w * x[i];
    }
    (min, max, sum_w, sum_x)
}

/// Weighted error of levels `l` under `scale` and `min` (absolute or
/// squared).
#[inline]
fn weighted_error(
    x: &[f32],
    l: &[u8],
    scale: f32,
    min: f32,
    use_mad: bool,
    w: &impl Fn(usize) -> f32,
) -> f32 {
    let mut err = 0f32;
    for i in 0..x.len() {
        let diff = scale * l[i] as f32 + min - x[i];
        let diff = if use_mad { diff.abs() } else { diff * diff };
        err += w(i) * diff;
    }
    err
}

/// The least-squares scale and min of one trial's levels, if the system
/// is not singular (`D > 0`); a positive min is clamped to zero.
#[inline]
fn fit(sum_w: f32, sum_x: f32, sum_l: f32, sum_l2: f32, sum_xl: f32) -> Option<(f32, f32)> {
    let d = sum_w * sum_l2 - sum_l * sum_l;
    if d > 0.0 {
        let this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
        let this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
        if this_min > 0.0 {
            return Some((sum_xl / sum_l2, 0.0));
        }
        return Some((this_scale, this_min));
    }
    None
}

/// Asymmetric levels `0..=nmax` with a min (ggml's `make_qkx2_quants`):
/// `nstep + 1` trial scales from `rmin + nmax` in steps of `rdelta`, each
/// refit by weighted least squares. Returns the scale and `-min`.
#[allow(clippy::too_many_arguments)]
pub fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    laux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    Trials::new(nmax, rmin, rdelta, nstep, use_mad).search(
        x,
        |i| weights[i],
        |max, min| max == min,
        |v| nearest_int(v).clamp(0, nmax),
        l_out,
        laux,
    )
}

/// `make_qkx2_quants`' successor for the importance-weighted paths
/// (ggml's `make_qkx3_quants`): weights default to `x^2`, and a trial
/// level is clamped before rounding so a min near max cannot overflow.
#[allow(clippy::too_many_arguments)]
pub fn make_qkx3_quants(
    nmax: i32,
    x: &[f32],
    weights: Option<&[f32]>,
    l_out: &mut [u8],
    laux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let nmaxf = nmax as f32;
    Trials::new(nmax, rmin, rdelta, nstep, use_mad).search(
        x,
        |i| match weights {
            Some(ws) => ws[i],
            None => x[i] * x[i],
        },
        |max, min| max <= min,
        |v| {
            if v > 0.0 {
                nearest_int(v.min(nmaxf))
            } else {
                0
            }
        },
        l_out,
        laux,
    )
}

/// The trial scales of the asymmetric searches: `nstep + 1` of them from
/// `rmin + nmax` in steps of `rdelta`, judged by weighted absolute
/// (`use_mad`) or squared error.
struct Trials {
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
}

impl Trials {
    fn new(nmax: i32, rmin: f32, rdelta: f32, nstep: i32, use_mad: bool) -> Self {
        Self {
            nmax,
            rmin,
            rdelta,
            nstep,
            use_mad,
        }
    }

    /// The search `make_qkx2_quants` and `make_qkx3_quants` share; they
    /// differ in the weights (`w`), in which `(max, min)` make a flat group
    /// (`flat`: all levels 0) and in how a trial rounds a scaled value to
    /// its level (`trial_level`). Returns the scale and `-min`.
    #[inline(always)]
    fn search(
        &self,
        x: &[f32],
        w: impl Fn(usize) -> f32,
        flat: impl Fn(f32, f32) -> bool,
        trial_level: impl Fn(f32) -> i32,
        l_out: &mut [u8],
        laux: &mut [u8],
    ) -> (f32, f32) {
        let (nmax, use_mad) = (self.nmax, self.use_mad);
        let n = x.len();
        let (mut min, max, sum_w, sum_x) = min_max_sums(x, &w);
        if min > 0.0 {
            min = 0.0;
        }
        if flat(max, min) {
            l_out[..n].fill(0);
            return (0.0, -min);
        }
        let nmaxf = nmax as f32;
        let mut iscale = nmaxf / (max - min);
        let mut scale = 1.0 / iscale;
        for i in 0..n {
            l_out[i] = nearest_int(iscale * (x[i] - min)).clamp(0, nmax) as u8;
        }
        let mut best_error = weighted_error(x, l_out, scale, min, use_mad, &w);
        if self.nstep < 1 {
            return (scale, -min);
        }
        for is in 0..=self.nstep {
            iscale = (self.rmin + self.rdelta * is as f32 + nmaxf) / (max - min);
            let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
            for i in 0..n {
                let l = trial_level(iscale * (x[i] - min));
                laux[i] = l as u8;
                let lf = l as f32;
                let wi = w(i);
                sum_l += wi * lf;
                sum_l2 += wi * lf * lf;
                sum_xl += wi * lf * x[i];
            }
            if let Some((this_scale, this_min)) = fit(sum_w, sum_x, sum_l, sum_l2, sum_xl) {
                let cur_error = weighted_error(x, laux, this_scale, this_min, use_mad, &w);
                if cur_error < best_error {
                    l_out[..n].copy_from_slice(&laux[..n]);
                    best_error = cur_error;
                    scale = this_scale;
                    min = this_min;
                }
            }
        }
        (scale, -min)
    }
}

/// Non-negative levels `0..=nmax` for a super-block's sub-block scales
/// (ggml's `make_qp_quants`), weighted by `quant_weights`.
pub fn make_qp_quants(nmax: i32, x: &[f32], l_out: &mut [u8], quant_weights: &[f32]) -> f32 {
    let n = x.len();
    let mut max = 0f32;
    for &v in x {
        max = if max > v { max } else { v };
    }
    if max < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let mut iscale = nmaxf / max;
    for i in 0..n {
        l_out[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0f32;
    for i in 0..n {
        let diff = x[i] - scale * l_out[i] as f32;
        best_mse += quant_weights[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1f32 * is as f32 + nmaxf) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0f32;
        for i in 0..n {
            let l = nearest_int(iscale_is * x[i]).min(nmax) as f32;
            let diff = x[i] - scale_is * l;
            mse += quant_weights[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let mut sumlx = 0f32;
    let mut suml2 = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).min(nmax);
        l_out[i] = l as u8;
        let w = quant_weights[i];
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = quant_weights[i];
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != l_out[i] as i32 {
                    let nl = new_l as f32;
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}
