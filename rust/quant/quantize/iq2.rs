//! IQ2_XXS, IQ2_XS and IQ2_S rows as ggml writes them
//! (`quantize_row_iq2_{xxs,xs,s}_impl`): 256-element super-blocks fitted
//! with eight-level groups of the IQ2 codebooks (`iq_search::fit`) under
//! one f16 and 4-bit block scales. IQ2_XXS and IQ2_XS take an importance
//! vector always (ggml refuses to run without one; `quantize_rows` checks
//! first, and a row reaching here without one is written as zeros).

use super::super::QK_K;
use super::iq_search::{
    fit, flip_negative, fmax, group_index, scale_code, sumx2, super_scale, unsigned_block, weights,
    Params,
};
use super::iq_tables::{iq2s, iq2xs, iq2xxs};
use super::search::{make_qp_quants, GROUP_MAX_EPS};

const GROUP_MAX_EPS_IQ2_S: f32 = 1e-8;

const XXS: Params = Params {
    kmax_q: 3,
    ntry: 6,
    step: 0.1,
    init_on_grid: true,
    refine_needs_off_grid: false,
    refine_skips_on_grid: false,
};

const XS: Params = Params {
    kmax_q: 3,
    ntry: 9,
    step: 0.1,
    init_on_grid: true,
    refine_needs_off_grid: true,
    refine_skips_on_grid: true,
};

/// Bytes: f16 d, then per 32-element block two u32: four grid indices,
/// and four 7-bit signs with the 4-bit scale on top.
pub fn quantize_xxs(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    let Some(qw) = qw else {
        out.fill(0);
        return;
    };
    let t = iq2xxs();
    let mut scales = [0f32; QK_K / 32];
    let (mut weight, mut waux, mut xval) = ([0f32; 32], [0f32; 32], [0f32; 32]);
    let mut l = [0i8; 32];
    let mut lqp = [0u8; 32];
    for (ibl, (xbl, y)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(66))
        .enumerate()
    {
        y.fill(0);
        let mut q2 = [0u32; 2 * (QK_K / 32)];
        let sigma2 = sumx2(xbl) / QK_K as f32;
        let mut max_scale = 0f32;
        for ib in 0..QK_K / 32 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            let q = &qw[QK_K * ibl + 32 * ib..QK_K * ibl + 32 * ib + 32];
            weights(xb, Some(q), sigma2, |v| v, &mut weight);
            let mut signs = [0u8; 4];
            let max = unsigned_block(xb, &weight, true, &mut xval, &mut waux, &mut signs);
            if max < GROUP_MAX_EPS {
                scales[ib] = 0.0;
                continue;
            }
            let scale0 = make_qp_quants(XXS.kmax_q + 1, &xval, &mut lqp, &weight);
            let eff_max = scale0 * XXS.kmax_q as f32;
            if eff_max <= 0.0 {
                scales[ib] = 0.0;
                continue;
            }
            l.fill(0);
            let scale = fit(t, &XXS, &xval, &weight, &waux, eff_max, scale0, &mut l);
            let scale = flip_negative(scale, &mut signs, true);
            for k in 0..4 {
                q2[2 * ib] |= (group_index(t, &l, k) as u32) << (8 * k);
                q2[2 * ib + 1] |= (signs[k] as u32) << (7 * k);
            }
            scales[ib] = scale;
            max_scale = fmax(max_scale, scale);
        }
        let Some(id) = super_scale(y, max_scale, 1.0) else {
            continue;
        };
        for ib in 0..QK_K / 32 {
            q2[2 * ib + 1] |= (scale_code(id, scales[ib]) as u32) << 28;
        }
        for (i, v) in q2.iter().enumerate() {
            y[2 + 4 * i..6 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// The 16-element blocks of IQ2_XS and IQ2_S: magnitudes fitted, signs
/// (seven bits for IQ2_XS, eight for IQ2_S). Returns the scale.
#[allow(clippy::too_many_arguments)]
fn block16(
    t: &super::iq_tables::GridTable,
    xb: &[f32],
    weight: &[f32],
    eps: f32,
    even_signs: bool,
    l: &mut [i8; 16],
    signs: &mut [u8; 2],
) -> Option<f32> {
    let mut waux = [0f32; 16];
    let mut xval = [0f32; 16];
    let max = unsigned_block(xb, weight, even_signs, &mut xval, &mut waux, signs);
    l.fill(0);
    if max < eps {
        return None;
    }
    let scale = fit(t, &XS, &xval, weight, &waux, max, max / 5.0, l);
    Some(flip_negative(scale, signs, even_signs))
}

/// Bytes: f16 d, 32 u16 of a 9-bit grid index and 7-bit signs, 8 bytes of
/// two 4-bit scales.
pub fn quantize_xs(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    let Some(qw) = qw else {
        out.fill(0);
        return;
    };
    let t = iq2xs();
    let mut scales = [0f32; QK_K / 16];
    let mut weight = [0f32; 16];
    let mut l = [0i8; 16];
    let mut signs = [0u8; 2];
    for (ibl, (xbl, y)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(74))
        .enumerate()
    {
        y.fill(0);
        let mut q2 = [0u16; 2 * (QK_K / 16)];
        let sigma2 = sumx2(xbl) / QK_K as f32;
        let mut max_scale = 0f32;
        for ib in 0..QK_K / 16 {
            let xb = &xbl[16 * ib..16 * ib + 16];
            let q = &qw[QK_K * ibl + 16 * ib..QK_K * ibl + 16 * ib + 16];
            weights(xb, Some(q), sigma2, |v| v, &mut weight);
            let Some(scale) = block16(t, xb, &weight, GROUP_MAX_EPS, true, &mut l, &mut signs)
            else {
                scales[ib] = 0.0;
                continue;
            };
            for k in 0..2 {
                q2[2 * ib + k] = group_index(t, &l, k) as u16 | ((signs[k] as u16) << 9);
            }
            scales[ib] = scale;
            max_scale = fmax(max_scale, scale);
        }
        let Some(id) = super_scale(y, max_scale, 1.0) else {
            continue;
        };
        for ib in 0..QK_K / 16 {
            y[66 + ib / 2] |= scale_code(id, scales[ib]) << (4 * (ib % 2));
        }
        for (i, v) in q2.iter().enumerate() {
            y[2 + 2 * i..4 + 2 * i].copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Bytes: f16 d, 32 low index bytes, 32 sign bytes, 8 bytes of index high
/// bits (2 per group), 8 bytes of two 4-bit scales.
pub fn quantize_s(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    let t = iq2s();
    let mut scales = [0f32; QK_K / 16];
    let mut weight = [0f32; 16];
    let mut l = [0i8; 16];
    let mut signs = [0u8; 2];
    for (ibl, (xbl, y)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(82))
        .enumerate()
    {
        y.fill(0);
        let sigma2 = 2.0 * sumx2(xbl) / QK_K as f32;
        let mut max_scale = 0f32;
        for ib in 0..QK_K / 16 {
            let xb = &xbl[16 * ib..16 * ib + 16];
            let q = qw.map(|q| &q[QK_K * ibl + 16 * ib..QK_K * ibl + 16 * ib + 16]);
            weights(xb, q, sigma2, |v| 0.25 * sigma2 + v * v, &mut weight);
            let Some(scale) = block16(
                t,
                xb,
                &weight,
                GROUP_MAX_EPS_IQ2_S,
                false,
                &mut l,
                &mut signs,
            ) else {
                scales[ib] = 0.0;
                continue;
            };
            for k in 0..2 {
                let gi = group_index(t, &l, k);
                let i8 = 2 * ib + k;
                y[2 + i8] = gi as u8;
                y[66 + i8 / 4] |= ((gi >> 8) << (2 * (i8 % 4))) as u8;
                y[2 + QK_K / 8 + i8] = signs[k];
            }
            scales[ib] = scale;
            max_scale = fmax(max_scale, scale);
        }
        let Some(id) = super_scale(y, max_scale, 0.9875) else {
            continue;
        };
        for ib in 0..QK_K / 16 {
            y[74 + ib / 2] |= scale_code(id, scales[ib]) << (4 * (ib % 2));
        }
    }
}
