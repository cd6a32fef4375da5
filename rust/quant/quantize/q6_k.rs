//! Q6_K rows as ggml writes them: sixteen groups of sixteen at 6 bits with
//! signed 8-bit scales from `make_qx_quants` (weighted by `x^2`, or by the
//! importance vector).

use super::super::block::{f16_at, put_f16};
use super::super::QK_K;
use super::search::{make_qx_quants, nearest_int, GROUP_MAX_EPS};

const BLOCK: usize = 210;

pub fn quantize(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (i, (xb, b)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(BLOCK))
        .enumerate()
    {
        let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
        for ib in 0..QK_K / 16 {
            let w = qw.map(|q| &q[QK_K * i + 16 * ib..QK_K * i + 16 * ib + 16]);
            let s = make_qx_quants(
                32,
                &xb[16 * ib..16 * ib + 16],
                &mut l[16 * ib..16 * ib + 16],
                1,
                w,
            );
            scales[ib] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            b.fill(0);
            continue;
        }
        let iscale = -128.0 / max_scale;
        put_f16(b, 208, 1.0 / iscale);
        for ib in 0..QK_K / 16 {
            b[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
        }
        let d_all = f16_at(b, 208);
        for j in 0..QK_K / 16 {
            let d = d_all * (b[192 + j] as i8) as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(xb[16 * j + ii] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        for (h, j) in (0..QK_K).step_by(128).enumerate() {
            let (ql, qh) = (64 * h, 128 + 32 * h);
            for k in 0..32 {
                let q = |o: usize| l[j + k + o] as u8;
                b[ql + k] = (q(0) & 0xf) | ((q(64) & 0xf) << 4);
                b[ql + k + 32] = (q(32) & 0xf) | ((q(96) & 0xf) << 4);
                b[qh + k] =
                    (q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) | ((q(96) >> 4) << 6);
            }
        }
    }
}
