//! IQ3_XXS and IQ3_S rows as ggml writes them (`quantize_row_iq3_xxs_impl`,
//! `quantize_row_iq3_s_impl`): 256-element super-blocks of 32-element
//! blocks, each fitted with four-level groups of the IQ3 codebooks
//! (`iq_search::fit`), a 4-bit scale per block (IQ3_XXS: per 32, packed
//! with seven-bit signs; IQ3_S: per 32, two a byte) under one f16.

use super::super::QK_K;
use super::iq_search::{
    fit, flip_negative, fmax, group_index, scale_code, sumx2, super_scale, unsigned_block, weights,
    Params,
};
use super::iq_tables::{iq3s, iq3xxs};

const GROUP_MAX_EPS_IQ3_XXS: f32 = 1e-8;

const XXS: Params = Params {
    kmax_q: 8,
    ntry: 15,
    step: 0.2,
    init_on_grid: true,
    refine_needs_off_grid: true,
    refine_skips_on_grid: true,
};

const S: Params = Params {
    kmax_q: 8,
    ntry: 9,
    step: 0.2,
    init_on_grid: false,
    refine_needs_off_grid: true,
    refine_skips_on_grid: false,
};

/// Bytes: f16 d, 64 grid indices, 8 u32 of four 7-bit signs + 4-bit scale.
pub fn quantize_xxs(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    let t = iq3xxs();
    let mut scales = [0f32; QK_K / 32];
    let (mut weight, mut waux, mut xval) = ([0f32; 32], [0f32; 32], [0f32; 32]);
    let mut l = [0i8; 32];
    for (ibl, (xbl, y)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(98))
        .enumerate()
    {
        y.fill(0);
        let mut q3 = [0u8; 64];
        let mut sas = [0u32; QK_K / 32];
        let sigma2 = 2.0 * sumx2(xbl) / QK_K as f32;
        let mut max_scale = 0f32;
        for ib in 0..QK_K / 32 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            let q = qw.map(|q| &q[QK_K * ibl + 32 * ib..QK_K * ibl + 32 * ib + 32]);
            weights(xb, q, sigma2, |v| v * v, &mut weight);
            let mut signs = [0u8; 4];
            let max = unsigned_block(xb, &weight, true, &mut xval, &mut waux, &mut signs);
            l.fill(0);
            if max < GROUP_MAX_EPS_IQ3_XXS {
                scales[ib] = 0.0;
                continue;
            }
            let scale0 = max / 15.0;
            let scale = fit(t, &XXS, &xval, &weight, &waux, max, scale0, &mut l);
            let scale = flip_negative(scale, &mut signs, true);
            for k in 0..8 {
                q3[8 * ib + k] = group_index(t, &l, k) as u8;
            }
            sas[ib] = signs[0] as u32
                | (signs[1] as u32) << 7
                | (signs[2] as u32) << 14
                | (signs[3] as u32) << 21;
            scales[ib] = scale;
            max_scale = fmax(max_scale, scale);
        }
        let Some(id) = super_scale(y, max_scale, 1.0125) else {
            continue;
        };
        for ib in 0..QK_K / 32 {
            sas[ib] |= (scale_code(id, scales[ib]) as u32) << 28;
        }
        y[2..66].copy_from_slice(&q3);
        for (ib, s) in sas.iter().enumerate() {
            y[66 + 4 * ib..70 + 4 * ib].copy_from_slice(&s.to_le_bytes());
        }
    }
}

/// Bytes: f16 d, 64 low index bytes, 8 bytes of index high bits, 32 sign
/// bytes, 4 bytes of two 4-bit scales.
pub fn quantize_s(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    const BS: usize = 32;
    let t = iq3s();
    let mut scales = [0f32; QK_K / BS];
    let (mut weight, mut waux, mut xval) = ([0f32; BS], [0f32; BS], [0f32; BS]);
    let mut l = [0i8; BS];
    for (ibl, (xbl, y)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(110))
        .enumerate()
    {
        y.fill(0);
        // ggml moves its index and sign cursors only past the blocks it
        // fits, so an all-zero block shifts the later ones forward.
        let (mut qs, mut sg) = (2usize, 74usize);
        let sigma2 = 2.0 * sumx2(xbl) / QK_K as f32;
        let mut max_scale = 0f32;
        for ib in 0..QK_K / BS {
            let xb = &xbl[BS * ib..BS * ib + BS];
            let q = qw.map(|q| &q[QK_K * ibl + BS * ib..QK_K * ibl + BS * ib + BS]);
            weights(xb, q, sigma2, |v| v * v, &mut weight);
            let mut signs = [0u8; BS / 8];
            let max = unsigned_block(xb, &weight, false, &mut xval, &mut waux, &mut signs);
            l.fill(0);
            if max == 0.0 {
                scales[ib] = 0.0;
                continue;
            }
            let scale0 = max / 15.0;
            let scale = fit(t, &S, &xval, &weight, &waux, max, scale0, &mut l);
            let scale = flip_negative(scale, &mut signs, false);
            for k in 0..BS / 4 {
                let gi = group_index(t, &l, k);
                y[qs + k] = gi as u8;
                let at = ib * (BS / 4) + k;
                y[66 + at / 8] |= ((gi >> 8) << (at % 8)) as u8;
            }
            qs += BS / 4;
            y[sg..sg + BS / 8].copy_from_slice(&signs);
            sg += BS / 8;
            scales[ib] = scale;
            max_scale = fmax(max_scale, scale);
        }
        let Some(id) = super_scale(y, max_scale, 1.033) else {
            continue;
        };
        for ib in (0..QK_K / BS).step_by(2) {
            let l1 = scale_code(id, scales[ib]);
            let l2 = scale_code(id, scales[ib + 1]);
            y[106 + ib / 2] = l1 | (l2 << 4);
        }
    }
}
