//! Q2_K rows as ggml writes them: sixteen groups of sixteen at 2 bits with
//! a 4-bit scale and min each (`make_qkx2_quants` under `|x|` weights), or
//! under an importance vector `make_qkx3_quants` and `make_qp_quants`.

use super::super::block::{f16_at, put_f16};
use super::super::QK_K;
use super::search::{make_qkx2_quants, make_qkx3_quants, make_qp_quants, nearest_int};

const BLOCK: usize = 84;

/// Levels from the stored scales, then the 2-bit packing.
fn finish(x: &[f32], l: &mut [u8; QK_K], b: &mut [u8]) {
    let (dm, mm) = (f16_at(b, 80), f16_at(b, 82));
    for j in 0..QK_K / 16 {
        let d = dm * (b[j] & 0xf) as f32;
        if d == 0.0 {
            continue;
        }
        let m = mm * (b[j] >> 4) as f32;
        for ii in 0..16 {
            l[16 * j + ii] = nearest_int((x[16 * j + ii] + m) / d).clamp(0, 3) as u8;
        }
    }
    for j in (0..QK_K).step_by(128) {
        for k in 0..32 {
            b[16 + j / 4 + k] =
                l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6);
        }
    }
}

pub fn quantize(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut laux = [0u8; 16];
    let mut weights = [0f32; 16];
    let mut mins = [0f32; QK_K / 16];
    let mut scales = [0f32; QK_K / 16];
    for (i, (xb, b)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(BLOCK))
        .enumerate()
    {
        match qw {
            None => {
                let (mut max_scale, mut max_min) = (0f32, 0f32);
                for j in 0..QK_K / 16 {
                    let xg = &xb[16 * j..16 * j + 16];
                    for (w, &v) in weights.iter_mut().zip(xg) {
                        *w = v.abs();
                    }
                    let (s, m) = make_qkx2_quants(
                        3,
                        xg,
                        &weights,
                        &mut l[16 * j..16 * j + 16],
                        &mut laux,
                        -0.5,
                        0.1,
                        15,
                        true,
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
                if max_scale > 0.0 {
                    let iscale = 15.0 / max_scale;
                    for j in 0..QK_K / 16 {
                        b[j] = nearest_int(iscale * scales[j]) as u8;
                    }
                    put_f16(b, 80, max_scale / 15.0);
                } else {
                    b[..16].fill(0);
                    put_f16(b, 80, 0.0);
                }
                if max_min > 0.0 {
                    let iscale = 15.0 / max_min;
                    for j in 0..QK_K / 16 {
                        b[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
                    }
                    put_f16(b, 82, max_min / 15.0);
                } else {
                    put_f16(b, 82, 0.0);
                }
            }
            Some(qw) => {
                let qw = &qw[QK_K * i..QK_K * (i + 1)];
                let mut sumx2 = 0f32;
                for &v in xb {
                    sumx2 += v * v;
                }
                let sigma2 = sumx2 / QK_K as f32;
                let mut sw = [0f32; QK_K / 16];
                for j in 0..QK_K / 16 {
                    for k in 0..16 {
                        let v = xb[16 * j + k];
                        weights[k] = qw[16 * j + k] * (sigma2 + v * v).sqrt();
                    }
                    for w in &weights {
                        sw[j] += w;
                    }
                    let (s, m) = make_qkx3_quants(
                        3,
                        &xb[16 * j..16 * j + 16],
                        Some(&weights),
                        &mut l[16 * j..16 * j + 16],
                        &mut laux,
                        -0.9,
                        0.05,
                        36,
                        false,
                    );
                    scales[j] = s;
                    mins[j] = m;
                }
                let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
                let dm = make_qp_quants(15, &scales, &mut ls, &sw);
                let mm = make_qp_quants(15, &mins, &mut lm, &sw);
                put_f16(b, 80, dm);
                put_f16(b, 82, mm);
                for j in 0..16 {
                    b[j] = ls[j] | (lm[j] << 4);
                }
            }
        }
        finish(xb, &mut l, b);
    }
}
