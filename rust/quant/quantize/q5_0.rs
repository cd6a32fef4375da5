//! Q5_0 rows as ggml writes them: the signed max maps to -16 (reference),
//! or `make_qx_quants` under an importance vector; the fifth bits go to
//! the block's 32-bit `qh`.

use super::super::block::put_f16;
use super::q4_0::signed_max;
use super::search::make_qx_quants;
use super::sigma2;

const QK: usize = 32;
const BLOCK: usize = 22;

/// Writes 32 five-bit levels: low nibbles of `j` and `j + 16` share byte
/// `j`, the fifth bits go to `qh` bit `j` (and `j + 16`).
pub(super) fn pack5(l: &[u8], qh_at: usize, qs_at: usize, b: &mut [u8]) {
    let mut qh = 0u32;
    for j in 0..16 {
        let (x0, x1) = (l[j], l[j + 16]);
        b[qs_at + j] = (x0 & 0x0f) | ((x1 & 0x0f) << 4);
        qh |= (((x0 & 0x10) >> 4) as u32) << j;
        qh |= (((x1 & 0x10) >> 4) as u32) << (j + 16);
    }
    b[qh_at..qh_at + 4].copy_from_slice(&qh.to_le_bytes());
}

pub fn quantize(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    let mut l = [0u8; QK];
    match qw {
        None => {
            for (xb, b) in x.chunks_exact(QK).zip(out.chunks_exact_mut(BLOCK)) {
                let d = signed_max(xb) / -16.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                put_f16(b, 0, d);
                for (lj, &v) in l.iter_mut().zip(xb) {
                    *lj = ((v * id + 16.5) as i8).min(31) as u8;
                }
                pack5(&l, 2, 6, b);
            }
        }
        Some(qw) => {
            let s2 = sigma2(x);
            let mut weight = [0f32; QK];
            let mut li = [0i8; QK];
            for ((xb, q), b) in x
                .chunks_exact(QK)
                .zip(qw.chunks_exact(QK))
                .zip(out.chunks_exact_mut(BLOCK))
            {
                for j in 0..QK {
                    weight[j] = q[j] * (s2 + xb[j] * xb[j]).sqrt();
                }
                let d = make_qx_quants(16, xb, &mut li, 1, Some(&weight));
                put_f16(b, 0, d);
                for (lj, &v) in l.iter_mut().zip(&li) {
                    *lj = v as u8;
                }
                pack5(&l, 2, 6, b);
            }
        }
    }
}
