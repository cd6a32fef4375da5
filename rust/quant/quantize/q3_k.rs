//! Q3_K rows as ggml writes them: sixteen groups of sixteen at 3 bits
//! (low two bits in `qs`, the third in `hmask`) with signed 6-bit scales,
//! from `make_q3_quants` (reference) or `make_qx_quants` under an
//! importance vector.

use super::super::block::{f16_at, put_f16};
use super::super::QK_K;
use super::search::{make_q3_quants, make_qx_quants, nearest_int};

const BLOCK: usize = 110;
const SCALES: usize = 96;
const D: usize = 108;

/// Stores group `j`'s 6-bit scale `l` (already offset by 32).
fn put_scale(sc: &mut [u8], j: usize, l: i32) {
    if j < 8 {
        sc[j] = (l & 0xf) as u8;
    } else {
        sc[j - 8] |= ((l & 0xf) << 4) as u8;
    }
    sc[j % 4 + 8] |= ((l >> 4) << (2 * (j / 4))) as u8;
}

/// Levels from the stored scales, then the high-bit mask and 2-bit packing.
fn finish(x: &[f32], l: &mut [i8; QK_K], b: &mut [u8]) {
    let d_all = f16_at(b, D);
    for j in 0..QK_K / 16 {
        let sc = &b[SCALES..SCALES + 12];
        let lo = if j < 8 { sc[j] & 0xf } else { sc[j - 8] >> 4 };
        let s = ((lo | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i8).wrapping_sub(32);
        let d = d_all * s as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-4, 3) + 4) as i8;
        }
    }
    b[..32].fill(0);
    let (mut m, mut hm) = (0usize, 1u8);
    for v in l.iter_mut() {
        if *v > 3 {
            b[m] |= hm;
            *v -= 4;
        }
        m += 1;
        if m == QK_K / 8 {
            m = 0;
            hm <<= 1;
        }
    }
    for j in (0..QK_K).step_by(128) {
        for k in 0..32 {
            b[32 + j / 4 + k] =
                (l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6))
                    as u8;
        }
    }
}

pub fn quantize(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (i, (xb, b)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(BLOCK))
        .enumerate()
    {
        b[SCALES..SCALES + 12].fill(0);
        match qw {
            None => {
                let (mut max_scale, mut amax) = (0f32, 0f32);
                for j in 0..QK_K / 16 {
                    scales[j] = make_q3_quants(
                        4,
                        &xb[16 * j..16 * j + 16],
                        &mut l[16 * j..16 * j + 16],
                        true,
                    );
                    let s = scales[j].abs();
                    if s > amax {
                        amax = s;
                        max_scale = scales[j];
                    }
                }
                if max_scale != 0.0 {
                    let iscale = -32.0 / max_scale;
                    for j in 0..QK_K / 16 {
                        let l8 = nearest_int(iscale * scales[j]) as i8 as i32;
                        put_scale(&mut b[SCALES..SCALES + 12], j, l8.clamp(-32, 31) + 32);
                    }
                    put_f16(b, D, 1.0 / iscale);
                } else {
                    put_f16(b, D, 0.0);
                }
            }
            Some(qw) => {
                let qw = &qw[QK_K * i..QK_K * (i + 1)];
                let mut sumx2 = 0f32;
                for &v in xb {
                    sumx2 += v * v;
                }
                let sigma2 = 2.0 * sumx2 / QK_K as f32;
                let mut weight = [0f32; 16];
                let mut sw = [0f32; QK_K / 16];
                for j in 0..QK_K / 16 {
                    for k in 0..16 {
                        let v = xb[16 * j + k];
                        weight[k] = qw[16 * j + k] * (sigma2 + v * v).sqrt();
                    }
                    let mut sumw = 0f32;
                    for w in &weight {
                        sumw += w;
                    }
                    sw[j] = sumw;
                    scales[j] = make_qx_quants(
                        4,
                        &xb[16 * j..16 * j + 16],
                        &mut l[16 * j..16 * j + 16],
                        1,
                        Some(&weight),
                    );
                }
                let mut ls = [0i8; QK_K / 16];
                let d_block = make_qx_quants(32, &scales, &mut ls, 1, Some(&sw));
                for j in 0..QK_K / 16 {
                    put_scale(&mut b[SCALES..SCALES + 12], j, ls[j] as i32);
                }
                put_f16(b, D, d_block);
            }
        }
        finish(xb, &mut l, b);
    }
}
