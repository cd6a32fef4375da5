//! IQ1_S and IQ1_M rows as ggml writes them (`quantize_row_iq1_s_impl`,
//! `quantize_row_iq1_m_impl`): each block's values take one of three
//! levels (-1, 0, 1, shifted by +-1/8), found by an exhaustive search over
//! the two split points of the block sorted by value; each group of eight
//! is then snapped to the IQ1 codebook.
//!
//! IQ1_S always takes an importance vector (ggml refuses to run without
//! one; `quantize_rows` checks first, and a row reaching here without one
//! is written as zeros).

use std::cmp::Ordering;

use super::super::block::put_f16;
use super::super::QK_K;
use super::iq_search::{fmax, sumx2, weights};
use super::iq_tables::{iq1, GridTable, Lookup};
use super::search::nearest_int;

const DELTA: f32 = 0.125;
const X_P: [f32; 3] = [-1.0 + DELTA, DELTA, 1.0 + DELTA];
const X_M: [f32; 3] = [-1.0 - DELTA, -DELTA, 1.0 - DELTA];
const GROUP_MAX_EPS_IQ1_S: f32 = 1e-12;
const GROUP_MAX_EPS_IQ1_M: f32 = 1e-7;

/// The positions of `xb` in ascending order of value, equal values in
/// position order (glibc's `qsort`, which ggml calls, is a stable merge
/// sort at these sizes).
fn sorted_positions(xb: &[f32], idx: &mut [usize]) {
    for (j, v) in idx.iter_mut().enumerate() {
        *v = j;
    }
    if xb.iter().any(|v| v.is_nan()) {
        // No order ggml's comparison could give; any total one will do.
        idx.sort_by(|&a, &b| xb[a].total_cmp(&xb[b]));
    } else {
        idx.sort_by(|&a, &b| xb[a].partial_cmp(&xb[b]).unwrap_or(Ordering::Equal));
    }
}

/// ggml's `iq1_find_best_neighbour2`: the candidate whose values `xg[l]`
/// at `scale` lie nearest `xval`; writes its levels to `l`.
fn best_neighbour(
    t: &GridTable,
    near: &[u16],
    xval: &[f32],
    weight: &[f32],
    scale: f32,
    xg: &[f32; 3],
    l: &mut [i8],
) -> usize {
    let mut best = f32::MAX;
    // Only a NaN loses every comparison; the first candidate stands in.
    let mut grid_index = near.first().copied().unwrap_or(0) as usize;
    for &j in near {
        let pg = t.point(j as usize);
        let mut d2 = 0f32;
        for i in 0..8 {
            let q = xg[((pg[i] - 1) / 2) as usize];
            let w = weight[i];
            let diff = scale * q - xval[i];
            d2 += w * diff * diff;
        }
        if d2 < best {
            best = d2;
            grid_index = j as usize;
        }
    }
    let pg = t.point(grid_index);
    for i in 0..8 {
        l[i] = (pg[i] - 1) / 2;
    }
    grid_index
}

/// Groups of eight levels to grid indices (snapping off-grid groups with
/// `xx_of(k)`'s values); refits the scale when a group moved.
fn snap(
    t: &GridTable,
    xb: &[f32],
    weight: &[f32],
    l: &mut [i8],
    mut scale: f32,
    xx_of: impl Fn(usize) -> &'static [f32; 3],
    index: &mut [usize],
) -> f32 {
    let mut all_on_grid = true;
    for k in 0..index.len() {
        let g = 8 * k..8 * k + 8;
        let mut u = 0usize;
        for (j, i) in g.clone().enumerate() {
            u |= (l[i] as usize) << (2 * j);
        }
        index[k] = match t.lookup(u) {
            Lookup::OnGrid(k) => k,
            Lookup::Near(near) => {
                all_on_grid = false;
                best_neighbour(
                    t,
                    near,
                    &xb[g.clone()],
                    &weight[g.clone()],
                    scale,
                    xx_of(k),
                    &mut l[g],
                )
            }
        };
    }
    if !all_on_grid {
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for k in 0..index.len() {
            let pg = t.point(index[k]);
            let xx = xx_of(k);
            for j in 0..8 {
                let w = weight[8 * k + j];
                let q = xx[((pg[j] - 1) / 2) as usize];
                sumqx += w * q * xb[8 * k + j];
                sumq2 += w * q * q;
            }
        }
        if sumqx > 0.0 && sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    scale
}

/// Levels from the best split: below `i1` level 0, below `i2` level 1.
fn split_levels(idx: &[usize], i1: usize, i2: usize, l: &mut [i8]) {
    for (j, &i) in idx.iter().enumerate() {
        l[i] = if j < i1 {
            0
        } else if j < i2 {
            1
        } else {
            2
        };
    }
}

fn max_abs(xb: &[f32]) -> f32 {
    let mut max = xb[0].abs();
    for &v in &xb[1..] {
        max = fmax(max, v.abs());
    }
    max
}

/// Bytes: f16 d, 32 low index bytes, 8 u16 of three 3-bit index high
/// parts, a 3-bit scale and the shift's sign.
pub fn quantize_s(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    const BS: usize = 32;
    let Some(qw) = qw else {
        out.fill(0);
        return;
    };
    let t = iq1();
    let mut scales = [0f32; QK_K / BS];
    let mut shifts = [1i8; QK_K / BS];
    let mut weight = [0f32; BS];
    let mut idx = [0usize; BS];
    let mut l = [0i8; BS];
    let mut index = [0usize; BS / 8];
    let (mut sumx, mut sumw) = ([0f32; BS + 1], [0f32; BS + 1]);
    for (ibl, (xbl, y)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(50))
        .enumerate()
    {
        y.fill(0);
        let mut qh = [0u16; QK_K / BS];
        let sigma2 = 2.0 * sumx2(xbl) / QK_K as f32;
        let mut max_scale = 0f32;
        for ib in 0..QK_K / BS {
            let xb = &xbl[BS * ib..BS * ib + BS];
            let q = &qw[QK_K * ibl + BS * ib..QK_K * ibl + BS * ib + BS];
            weights(xb, Some(q), sigma2, |v| v, &mut weight);
            let max = max_abs(xb);
            scales[ib] = 0.0;
            shifts[ib] = 1;
            if max < GROUP_MAX_EPS_IQ1_S {
                continue;
            }
            sorted_positions(xb, &mut idx);
            for j in 0..BS {
                let i = idx[j];
                sumx[j + 1] = sumx[j] + weight[i] * xb[i];
                sumw[j + 1] = sumw[j] + weight[i];
            }
            let mut best_score = -f32::MAX;
            let mut scale = max;
            let mut best: Option<(usize, usize, i8)> = None;
            for i1 in 0..=BS {
                for i2 in i1..=BS {
                    for (xs, shift) in [(&X_P, 1i8), (&X_M, -1i8)] {
                        let sumqx = (sumx[i1] - sumx[0]) * xs[0]
                            + (sumx[i2] - sumx[i1]) * xs[1]
                            + (sumx[BS] - sumx[i2]) * xs[2];
                        let sumq2 = (sumw[i1] - sumw[0]) * xs[0] * xs[0]
                            + (sumw[i2] - sumw[i1]) * xs[1] * xs[1]
                            + (sumw[BS] - sumw[i2]) * xs[2] * xs[2];
                        if sumq2 > 0.0 && sumqx * sumqx > best_score * sumq2 {
                            scale = sumqx / sumq2;
                            best_score = scale * sumqx;
                            best = Some((i1, i2, shift));
                        }
                    }
                }
            }
            let Some((i1, i2, mut shift)) = best else {
                continue;
            };
            split_levels(&idx, i1, i2, &mut l);
            if scale < 0.0 {
                for v in l.iter_mut() {
                    *v = 2 - *v;
                }
                scale = -scale;
                shift = -shift;
            }
            let xx: &'static [f32; 3] = if shift == 1 { &X_P } else { &X_M };
            scale = snap(t, xb, &weight, &mut l, scale, |_| xx, &mut index);
            let mut h = 0u16;
            for k in 0..BS / 8 {
                y[2 + (BS / 8) * ib + k] = index[k] as u8;
                h |= ((index[k] >> 8) << (3 * k)) as u16;
            }
            qh[ib] = h;
            scales[ib] = scale;
            shifts[ib] = shift;
            max_scale = fmax(max_scale, scale);
        }
        if max_scale != 0.0 {
            let d = max_scale / 15.0;
            put_f16(y, 0, d * 1.125);
            let id = 1.0 / d;
            for ib in 0..QK_K / BS {
                let mut lv = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7) as u16;
                if shifts[ib] == -1 {
                    lv |= 8;
                }
                qh[ib] |= lv << 12;
            }
        }
        for (ib, h) in qh.iter().enumerate() {
            y[34 + 2 * ib..36 + 2 * ib].copy_from_slice(&h.to_le_bytes());
        }
    }
}

/// The shifts of IQ1_M's two halves: 0 (+,+), 1 (+,-), 2 (-,+), 3 (-,-).
fn half_values(best_k: usize, k: usize) -> &'static [f32; 3] {
    let plus = if k == 0 {
        best_k < 2
    } else {
        best_k.is_multiple_of(2)
    };
    if plus {
        &X_P
    } else {
        &X_M
    }
}

/// Bytes: 32 low index bytes, 16 bytes of two 3-bit index high parts and
/// shift bits, 8 bytes of 3-bit block scales with the f16 super-block
/// scale spread over their top nibbles.
pub fn quantize_m(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    const BS: usize = 16;
    const MASKS: [u8; 4] = [0x00, 0x80, 0x08, 0x88];
    let t = iq1();
    let mut scales = [0f32; QK_K / BS];
    let mut shifts = [0usize; QK_K / BS];
    let mut weight = [0f32; BS];
    let mut idx = [0usize; BS];
    let mut l = [0i8; BS];
    let mut index = [0usize; BS / 8];
    let cp1 = X_P[0] * X_P[0] - X_P[1] * X_P[1];
    let cp2 = X_P[1] * X_P[1] - X_P[2] * X_P[2];
    let cm1 = X_M[0] * X_M[0] - X_M[1] * X_M[1];
    let cm2 = X_M[1] * X_M[1] - X_M[2] * X_M[2];
    let (p2, m2) = (X_P[2], X_M[2]);
    for (ibl, (xbl, y)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(56))
        .enumerate()
    {
        y.fill(0);
        let sigma2 = 2.0 * sumx2(xbl) / QK_K as f32;
        let qw_of = |ib: usize| qw.map(|q| &q[QK_K * ibl + BS * ib..QK_K * ibl + BS * ib + BS]);
        let mut max_scale = 0f32;
        for ib in 0..QK_K / BS {
            let xb = &xbl[BS * ib..BS * ib + BS];
            weights(xb, qw_of(ib), sigma2, |v| v * v, &mut weight);
            let max = max_abs(xb);
            scales[ib] = 0.0;
            shifts[ib] = 0;
            if max < GROUP_MAX_EPS_IQ1_M {
                continue;
            }
            sorted_positions(xb, &mut idx);
            // Prefix sums per half: each half may take its own shift.
            let mut px = [[0f32; BS + 1]; 2];
            let mut pw = [[0f32; BS + 1]; 2];
            for j in 0..BS {
                let i = idx[j];
                let h = if i < BS / 2 { 0 } else { 1 };
                px[h][j + 1] = px[h][j] + weight[i] * xb[i];
                px[1 - h][j + 1] = px[1 - h][j];
                pw[h][j + 1] = pw[h][j] + weight[i];
                pw[1 - h][j + 1] = pw[1 - h][j];
            }
            let txs = [px[0][BS], px[1][BS]];
            let tws = [pw[0][BS], pw[1][BS]];
            let mut best_score = -f32::MAX;
            let mut scale = max;
            let mut best: Option<(usize, usize, usize)> = None;
            for i1 in 0..=BS {
                for i2 in i1..=BS {
                    let (mut qx_p, mut qx_m, mut q2_p, mut q2_m) =
                        ([0f32; 2], [0f32; 2], [0f32; 2], [0f32; 2]);
                    for h in 0..2 {
                        let sx = px[h][i1] + px[h][i2];
                        qx_p[h] = txs[h] * p2 - sx;
                        qx_m[h] = txs[h] * m2 - sx;
                        q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                        q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                    }
                    let sumqx = [
                        qx_p[0] + qx_p[1],
                        qx_p[0] + qx_m[1],
                        qx_m[0] + qx_p[1],
                        qx_m[0] + qx_m[1],
                    ];
                    let sumq2 = [
                        q2_p[0] + q2_p[1],
                        q2_p[0] + q2_m[1],
                        q2_m[0] + q2_p[1],
                        q2_m[0] + q2_m[1],
                    ];
                    for k in 0..4 {
                        if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best_score * sumq2[k] {
                            scale = sumqx[k] / sumq2[k];
                            best_score = scale * sumqx[k];
                            best = Some((i1, i2, k));
                        }
                    }
                }
            }
            let Some((i1, i2, mut best_k)) = best else {
                continue;
            };
            split_levels(&idx, i1, i2, &mut l);
            if scale < 0.0 {
                for v in l.iter_mut() {
                    *v = 2 - *v;
                }
                scale = -scale;
                best_k = 3 - best_k;
            }
            scale = snap(
                t,
                xb,
                &weight,
                &mut l,
                scale,
                |k| half_values(best_k, k),
                &mut index,
            );
            y[2 * ib] = index[0] as u8;
            y[2 * ib + 1] = index[1] as u8;
            y[32 + ib] = ((index[0] >> 8) | ((index[1] >> 8) << 4)) as u8;
            scales[ib] = scale;
            shifts[ib] = best_k;
            max_scale = fmax(max_scale, scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let mut sc = [0u16; 4];
        let mut d = max_scale / 15.0;
        let id = 1.0 / d;
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for ib in 0..QK_K / BS {
            let lv = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
            sc[ib / 4] |= (lv as u16) << (3 * (ib % 4));
            y[32 + ib] |= MASKS[shifts[ib]];
            let xb = &xbl[BS * ib..BS * ib + BS];
            weights(xb, qw_of(ib), sigma2, |v| v * v, &mut weight);
            let qh = y[32 + ib] as usize;
            for k in 0..BS / 8 {
                let xx = half_values(shifts[ib], k);
                let pg = t.point(y[2 * ib + k] as usize + ((qh << (8 - 4 * k)) & 0x700));
                for j in 0..8 {
                    let w = weight[8 * k + j];
                    let q = xx[((pg[j] - 1) / 2) as usize] * (2 * lv + 1) as f32;
                    sumqx += w * q * xb[8 * k + j];
                    sumq2 += w * q * q;
                }
            }
        }
        if sumq2 > 0.0 {
            d = sumqx / sumq2;
        }
        let s = half::f16::from_f32(d * 1.1125).to_bits();
        sc[0] |= (s & 0x000f) << 12;
        sc[1] |= (s & 0x00f0) << 8;
        sc[2] |= (s & 0x0f00) << 4;
        sc[3] |= s & 0xf000;
        for (i, v) in sc.iter().enumerate() {
            y[48 + 2 * i..50 + 2 * i].copy_from_slice(&v.to_le_bytes());
        }
    }
}
