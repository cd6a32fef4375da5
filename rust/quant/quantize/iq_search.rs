//! The scale search shared by the IQ2 and IQ3 quantizers: a block of
//! magnitudes is fitted with codebook groups (levels `l`, value `2l + 1`)
//! at a range of trial scales, each group snapped to the grid or to its
//! best neighbour, and the best fit refined once more at its own scale.
//!
//! The formats differ only in the trial scales and in which groups the
//! refinement revisits; `Params` names those differences. Around the
//! search they share the rest of a block's path too: its signs taken out
//! (`unsigned_block`), a negative fit flipped back (`flip_negative`), and
//! the super-block's scale and 4-bit block codes (`super_scale`,
//! `scale_code`). Operation order
//! follows ggml's quantizers exactly (see `search`).

use super::super::block::put_f16;
use super::iq_tables::{GridTable, Lookup};
use super::search::nearest_int;

pub struct Params {
    /// Levels are `0..kmax_q`.
    pub kmax_q: i32,
    /// Trial `is` runs over `-ntry..=ntry`, id = (2 kmax_q - 1 + is step) / max.
    pub ntry: i32,
    pub step: f32,
    /// Whether the groups start as on the grid before any trial is kept.
    pub init_on_grid: bool,
    /// Whether the refinement runs only when some group was off the grid.
    pub refine_needs_off_grid: bool,
    /// Whether the refinement skips the groups that were on the grid.
    pub refine_skips_on_grid: bool,
}

/// ggml's `iq{2,3}_find_best_neighbour`: the candidate nearest `scale *
/// (2l + 1)` to `xval` in `weight`ed squared distance, the first of ties;
/// writes its levels to `l`.
fn best_neighbour(
    t: &GridTable,
    near: &[u16],
    xval: &[f32],
    weight: &[f32],
    scale: f32,
    l: &mut [i8],
) -> usize {
    let mut best_d2 = f32::MAX;
    // ggml asserts a candidate wins; only a NaN input loses every
    // comparison, and then the first candidate stands in.
    let mut grid_index = near.first().copied().unwrap_or(0) as usize;
    for &j in near {
        let pg = t.point(j as usize);
        let mut d2 = 0f32;
        for i in 0..t.dim {
            let q = pg[i] as f32;
            let diff = scale * q - xval[i];
            d2 += weight[i] * diff * diff;
        }
        if d2 < best_d2 {
            best_d2 = d2;
            grid_index = j as usize;
        }
    }
    let pg = t.point(grid_index);
    for i in 0..t.dim {
        l[i] = (pg[i] - 1) / 2;
    }
    grid_index
}

/// Packs a group's levels into the table's key.
#[inline]
fn key(l: &[i8], bits: usize) -> usize {
    let mut u = 0usize;
    for (i, &v) in l.iter().enumerate() {
        u |= (v as usize) << (bits * i);
    }
    u
}

fn sums(weight: &[f32], xval: &[f32], l: &[i8]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for i in 0..xval.len() {
        let w = weight[i];
        let q = (2 * l[i] as i32 + 1) as f32;
        sumqx += w * xval[i] * q;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// Fits `xval` (`n` magnitudes, groups of `t.dim`); `max` is the divisor
/// of the trial scales and `scale` the scale kept if no trial fits. Writes
/// the chosen levels (every group on the grid) to `l` and returns the
/// block scale.
#[allow(clippy::too_many_arguments)]
pub fn fit(
    t: &GridTable,
    p: &Params,
    xval: &[f32],
    weight: &[f32],
    waux: &[f32],
    max: f32,
    mut scale: f32,
    l: &mut [i8],
) -> f32 {
    let n = xval.len();
    let dim = t.dim;
    let bits = if dim == 8 { 2 } else { 3 };
    let ngroups = n / dim;
    let mut laux = [0i8; 32];
    let mut on_grid = [p.init_on_grid; 8];
    let mut on_grid_aux = [true; 8];
    let mut best = 0f32;
    let top = (2 * p.kmax_q - 1) as f32;
    for is in -p.ntry..=p.ntry {
        let id = (top + is as f32 * p.step) / max;
        let this_scale = 1.0 / id;
        for k in 0..ngroups {
            let g = k * dim..(k + 1) * dim;
            for i in g.clone() {
                let v = nearest_int(0.5 * (id * xval[i] - 1.0));
                laux[i] = v.clamp(0, p.kmax_q - 1) as i8;
            }
            on_grid_aux[k] = true;
            if let Lookup::Near(near) = t.lookup(key(&laux[g.clone()], bits)) {
                on_grid_aux[k] = false;
                best_neighbour(
                    t,
                    near,
                    &xval[g.clone()],
                    &waux[g.clone()],
                    this_scale,
                    &mut laux[g],
                );
            }
        }
        let (sumqx, sumq2) = sums(weight, xval, &laux[..n]);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            l[..n].copy_from_slice(&laux[..n]);
            on_grid[..ngroups].copy_from_slice(&on_grid_aux[..ngroups]);
        }
    }
    let any_off = on_grid[..ngroups].iter().any(|&g| !g);
    if (any_off || !p.refine_needs_off_grid) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..ngroups {
            if p.refine_skips_on_grid && on_grid[k] {
                continue;
            }
            let g = k * dim..(k + 1) * dim;
            let mut u = 0usize;
            for (j, i) in g.clone().enumerate() {
                let v = nearest_int(0.5 * (id * xval[i] - 1.0)).clamp(0, p.kmax_q - 1);
                u |= (v as usize) << (bits * j);
            }
            let k_grid = match t.lookup(u) {
                Lookup::OnGrid(k) => k,
                Lookup::Near(near) => best_neighbour(
                    t,
                    near,
                    &xval[g.clone()],
                    &waux[g.clone()],
                    scale,
                    &mut l[g.clone()],
                ),
            };
            let pg = t.point(k_grid);
            for (j, i) in g.enumerate() {
                l[i] = (pg[j] - 1) / 2;
            }
        }
        let (sumqx, sumq2) = sums(weight, xval, &l[..n]);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    scale
}

/// The grid index of group `k` of `l` (always on the grid after `fit`;
/// ggml aborts otherwise, we write point 0).
pub fn group_index(t: &GridTable, l: &[i8], k: usize) -> usize {
    let bits = if t.dim == 8 { 2 } else { 3 };
    t.index_of(key(&l[k * t.dim..(k + 1) * t.dim], bits))
        .unwrap_or(0)
}

/// Magnitudes and sign bits of eight values; with `even`, an odd count of
/// negatives is made even by flipping the least important value (its sign
/// bit is then implied), as the IQ2_XXS/XS and IQ3_XXS formats store 7 bits.
pub fn signs8(xb: &[f32], weight: &[f32], xval: &mut [f32], even: bool) -> u8 {
    let mut s = 0u8;
    let mut nflip = 0;
    for i in 0..8 {
        if xb[i] >= 0.0 {
            xval[i] = xb[i];
        } else {
            xval[i] = -xb[i];
            nflip += 1;
            s |= 1 << i;
        }
    }
    if !even {
        return s;
    }
    if nflip % 2 == 1 {
        let mut imin = 0;
        let mut min = weight[0] * xb[0] * xb[0];
        for i in 1..8 {
            let ax = weight[i] * xb[i] * xb[i];
            if ax < min {
                min = ax;
                imin = i;
            }
        }
        xval[imin] = -xval[imin];
        s ^= 1 << imin;
    }
    s & 127
}

/// One block made ready to fit: its magnitudes in `xval` and the sign
/// bits of each eight in `signs` (as `signs8` gives them), the square
/// roots of its weights in `waux`. Returns its largest magnitude.
pub fn unsigned_block(
    xb: &[f32],
    weight: &[f32],
    even_signs: bool,
    xval: &mut [f32],
    waux: &mut [f32],
    signs: &mut [u8],
) -> f32 {
    let n = xb.len();
    for i in 0..n {
        waux[i] = weight[i].sqrt();
    }
    for (k, s) in signs.iter_mut().enumerate() {
        let r = 8 * k..8 * k + 8;
        *s = signs8(&xb[r.clone()], &weight[r.clone()], &mut xval[r], even_signs);
    }
    let mut max = xval[0];
    for &v in &xval[1..n] {
        max = fmax(max, v);
    }
    max
}

/// A fitted scale made positive: a negative one flips the block's signs
/// (seven bits each with `even_signs`, else eight), as ggml does.
#[inline]
pub fn flip_negative(scale: f32, signs: &mut [u8], even_signs: bool) -> f32 {
    if scale < 0.0 {
        for s in signs.iter_mut() {
            *s = if even_signs { !*s & 127 } else { !*s };
        }
        -scale
    } else {
        scale
    }
}

/// A block scale's 4-bit code under the super-block's `1 / d`: the `l` of
/// `(2l + 1) d` nearest `scale`.
#[inline]
pub fn scale_code(id: f32, scale: f32) -> u8 {
    nearest_int(0.5 * (id * scale - 1.0)).clamp(0, 15) as u8
}

/// The super-block's `d` for block scales up to `max_scale` (codes up to
/// 15 give `31 d`), written as an f16 times `mul` (each format's own
/// correction, as ggml writes it); returns `1 / d`. None when every block
/// scale is zero: the super-block stays all zero.
pub fn super_scale(y: &mut [u8], max_scale: f32, mul: f32) -> Option<f32> {
    if max_scale == 0.0 {
        return None;
    }
    let d = max_scale / 31.0;
    put_f16(y, 0, d * mul);
    Some(1.0 / d)
}

/// ggml's `MAX(a, b)` on floats: `b` unless `a > b`.
#[inline]
pub fn fmax(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// Per-element weights: `qw * sqrt(sigma2 + x^2)` with an importance
/// vector, `fallback(x)` without.
pub fn weights(
    xb: &[f32],
    qw: Option<&[f32]>,
    sigma2: f32,
    fallback: impl Fn(f32) -> f32,
    weight: &mut [f32],
) {
    match qw {
        Some(q) => {
            for i in 0..xb.len() {
                weight[i] = q[i] * (sigma2 + xb[i] * xb[i]).sqrt();
            }
        }
        None => {
            for i in 0..xb.len() {
                weight[i] = fallback(xb[i]);
            }
        }
    }
}

/// `sum x^2` over a super-block.
pub fn sumx2(x: &[f32]) -> f32 {
    let mut s = 0f32;
    for &v in x {
        s += v * v;
    }
    s
}
