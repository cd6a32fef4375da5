//! Q5_1 rows as ggml writes them: `d = (max - min) / 31` and `m = min`
//! (reference), or `make_qkx3_quants` under an importance vector.

use super::super::block::put_f16;
use super::q4_1::min_max;
use super::q5_0::pack5;
use super::search::make_qkx3_quants;
use super::sigma2;

const QK: usize = 32;
const BLOCK: usize = 24;

pub fn quantize(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    let mut l = [0u8; QK];
    match qw {
        None => {
            for (xb, b) in x.chunks_exact(QK).zip(out.chunks_exact_mut(BLOCK)) {
                let (min, max) = min_max(xb);
                let d = (max - min) / 31.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                put_f16(b, 0, d);
                put_f16(b, 2, min);
                for (lj, &v) in l.iter_mut().zip(xb) {
                    *lj = ((v - min) * id + 0.5) as u8;
                }
                pack5(&l, 4, 8, b);
            }
        }
        Some(qw) => {
            let s2 = sigma2(x);
            let mut weight = [0f32; QK];
            let mut laux = [0u8; QK];
            for ((xb, q), b) in x
                .chunks_exact(QK)
                .zip(qw.chunks_exact(QK))
                .zip(out.chunks_exact_mut(BLOCK))
            {
                for j in 0..QK {
                    weight[j] = q[j] * (s2 + xb[j] * xb[j]).sqrt();
                }
                let (d, neg_min) = make_qkx3_quants(
                    31,
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
                pack5(&l, 4, 8, b);
            }
        }
    }
}
