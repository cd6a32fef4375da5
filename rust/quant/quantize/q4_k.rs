//! Q4_K rows as ggml writes them: eight groups of 32 at 4 bits with 6-bit
//! scales and mins, from `make_qkx2_quants` (reference) or, under an
//! importance vector, `make_qkx3_quants` and `make_qp_quants`.

use super::super::block::{f16_at, put_f16};
use super::super::kquant_scales::scale_min_k4;
use super::super::QK_K;
use super::search::{make_qkx2_quants, make_qkx3_quants, make_qp_quants, nearest_int};

const BLOCK: usize = 144;

/// The eight (scale, min) pairs of a Q4_K or Q5_K super-block found by
/// ggml's search for `nmax` levels, stored into `b[4..16]` with `d` and
/// `dmin`; `l` holds the search's levels.
pub(super) fn scales_and_mins(
    nmax: i32,
    xb: &[f32],
    qw: Option<&[f32]>,
    l: &mut [u8; QK_K],
    b: &mut [u8],
) {
    let mut laux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut mins = [0f32; QK_K / 32];
    let mut scales = [0f32; QK_K / 32];
    let (ls, lm): ([u8; 8], [u8; 8]);
    match qw {
        None => {
            let (rmin, nstep) = if nmax == 15 { (-1.0, 20) } else { (-0.5, 15) };
            let (mut max_scale, mut max_min) = (0f32, 0f32);
            for j in 0..QK_K / 32 {
                let xg = &xb[32 * j..32 * j + 32];
                let mut sum_x2 = 0f32;
                for &v in xg {
                    sum_x2 += v * v;
                }
                let av_x = (sum_x2 / 32.0).sqrt();
                for (w, &v) in weights.iter_mut().zip(xg) {
                    *w = av_x + v.abs();
                }
                let (s, m) = make_qkx2_quants(
                    nmax,
                    xg,
                    &weights,
                    &mut l[32 * j..32 * j + 32],
                    &mut laux,
                    rmin,
                    0.1,
                    nstep,
                    false,
                );
                scales[j] = s;
                mins[j] = m;
                if s > max_scale {
                    max_scale = s;
                }
                if m > max_min {
                    max_min = m;
                }
            }
            let inv_scale = if max_scale > 0.0 {
                63.0 / max_scale
            } else {
                0.0
            };
            let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
            ls = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
            lm = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
            put_f16(b, 0, max_scale / 63.0);
            put_f16(b, 2, max_min / 63.0);
        }
        Some(qw) => {
            let mut sum_x2 = 0f32;
            for &v in xb {
                sum_x2 += v * v;
            }
            let sigma2 = 2.0 * sum_x2 / QK_K as f32;
            let mut sw = [0f32; QK_K / 32];
            for j in 0..QK_K / 32 {
                for k in 0..32 {
                    let v = xb[32 * j + k];
                    weights[k] = qw[32 * j + k] * (sigma2 + v * v).sqrt();
                }
                let mut sumw = 0f32;
                for w in &weights {
                    sumw += w;
                }
                sw[j] = sumw;
                let (s, m) = make_qkx3_quants(
                    nmax,
                    &xb[32 * j..32 * j + 32],
                    Some(&weights),
                    &mut l[32 * j..32 * j + 32],
                    &mut laux,
                    -0.9,
                    0.05,
                    36,
                    false,
                );
                scales[j] = s;
                mins[j] = m;
            }
            let (mut s6, mut m6) = ([0u8; 8], [0u8; 8]);
            let d_block = make_qp_quants(63, &scales, &mut s6, &sw);
            let m_block = make_qp_quants(63, &mins, &mut m6, &sw);
            // ggml clamps these to 63 for Q5_K only; a wrapped negative
            // level of Q4_K goes into the packing unclamped, as there.
            let cap = if nmax == 31 { 63 } else { u8::MAX };
            ls = s6.map(|v| v.min(cap));
            lm = m6.map(|v| v.min(cap));
            put_f16(b, 0, d_block);
            put_f16(b, 2, m_block);
        }
    }
    let sc = &mut b[4..16];
    for j in 0..QK_K / 32 {
        if j < 4 {
            sc[j] = ls[j];
            sc[j + 4] = lm[j];
        } else {
            sc[j + 4] = (ls[j] & 0xf) | ((lm[j] & 0xf) << 4);
            sc[j - 4] |= (ls[j] >> 4) << 6;
            sc[j] |= (lm[j] >> 4) << 6;
        }
    }
    let (d_all, m_all) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..QK_K / 32 {
        let (s, m) = scale_min_k4(j, &b[4..16]);
        let d = d_all * s as f32;
        if d == 0.0 {
            continue;
        }
        let dm = m_all * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((xb[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
}

pub fn quantize(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    let mut l = [0u8; QK_K];
    for (i, (xb, b)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(BLOCK))
        .enumerate()
    {
        scales_and_mins(15, xb, qw.map(|q| &q[QK_K * i..QK_K * (i + 1)]), &mut l, b);
        for (g, j) in (0..QK_K).step_by(64).enumerate() {
            for k in 0..32 {
                b[16 + 32 * g + k] = l[j + k] | (l[j + k + 32] << 4);
            }
        }
    }
}
