//! Q4_1 rows as ggml writes them: `d = (max - min) / 15` and `m = min`
//! (reference), or `make_qkx3_quants` under an importance vector.

use super::super::block::put_f16;
use super::search::make_qkx3_quants;
use super::sigma2;

const QK: usize = 32;
const BLOCK: usize = 20;

/// Min and max of a block, as ggml's `FLT_MAX`-seeded scan finds them.
#[inline]
pub(super) fn min_max(xb: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in xb {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

pub fn quantize(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    match qw {
        None => {
            for (xb, b) in x.chunks_exact(QK).zip(out.chunks_exact_mut(BLOCK)) {
                let (min, max) = min_max(xb);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                put_f16(b, 0, d);
                put_f16(b, 2, min);
                for j in 0..QK / 2 {
                    let q0 = (((xb[j] - min) * id + 0.5) as i8).min(15) as u8;
                    let q1 = (((xb[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
                    b[4 + j] = q0 | (q1 << 4);
                }
            }
        }
        Some(qw) => {
            let s2 = sigma2(x);
            let mut weight = [0f32; QK];
            let (mut l, mut laux) = ([0u8; QK], [0u8; QK]);
            for ((xb, q), b) in x
                .chunks_exact(QK)
                .zip(qw.chunks_exact(QK))
                .zip(out.chunks_exact_mut(BLOCK))
            {
                for j in 0..QK {
                    weight[j] = q[j] * (s2 + xb[j] * xb[j]).sqrt();
                }
                let (d, neg_min) = make_qkx3_quants(
                    15,
                    xb,
                    Some(&weight),
                    &mut l,
                    &mut laux,
                    -0.9,
                    0.05,
                    36,
                    false,
                );
                put_f16(b, 0, d);
                put_f16(b, 2, -neg_min);
                for j in 0..16 {
                    b[4 + j] = l[j] | (l[j + 16] << 4);
                }
            }
        }
    }
}
