//! Q4_0 rows as ggml writes them: the signed max maps to -8 (the reference
//! path), or, with an importance vector, the weighted search of
//! `make_qx_quants` over each block.

use super::super::block::put_f16;
use super::search::make_qx_quants;
use super::sigma2;

const QK: usize = 32;
const BLOCK: usize = 18;

/// The element of largest magnitude, first one on ties.
#[inline]
pub(super) fn signed_max(xb: &[f32]) -> f32 {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in xb {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

pub fn quantize(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    match qw {
        None => reference(x, out),
        Some(qw) => weighted(x, qw, out),
    }
}

fn reference(x: &[f32], out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK).zip(out.chunks_exact_mut(BLOCK)) {
        let d = signed_max(xb) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, 0, d);
        for j in 0..QK / 2 {
            let q0 = ((xb[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((xb[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
            b[2 + j] = q0 | (q1 << 4);
        }
    }
}

fn weighted(x: &[f32], qw: &[f32], out: &mut [u8]) {
    let s2 = sigma2(x);
    let mut weight = [0f32; QK];
    let mut l = [0i8; QK];
    for ((xb, q), b) in x
        .chunks_exact(QK)
        .zip(qw.chunks_exact(QK))
        .zip(out.chunks_exact_mut(BLOCK))
    {
        for j in 0..QK {
            weight[j] = q[j] * (s2 + xb[j] * xb[j]).sqrt();
        }
        let d = make_qx_quants(8, xb, &mut l, 1, Some(&weight));
        put_f16(b, 0, d);
        for j in 0..16 {
            b[2 + j] = l[j] as u8 | ((l[j + 16] as u8) << 4);
        }
    }
}
