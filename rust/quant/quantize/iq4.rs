//! IQ4_NL and IQ4_XS rows as ggml writes them (`quantize_row_iq4_nl_impl`,
//! seven trial scales either side): 32-element blocks of indices into the
//! non-linear codebook, with one f16 scale (IQ4_NL) or, for IQ4_XS, a
//! super-block f16 and a signed 6-bit scale per block.

use super::super::block::put_f16;
use super::super::iq_common::KVALUES_IQ4NL;
use super::super::QK_K;
use super::search::{best_index_int8, nearest_int, GROUP_MAX_EPS};

const NTRY: i32 = 7;

/// One super-block of `x.len()` elements (32 for IQ4_NL, 256 for IQ4_XS).
/// Returns the levels in `l`, the super-block scale, and for IQ4_XS the
/// 6-bit block scales (`ls`, offset by 32).
fn superblock(x: &[f32], qw: Option<&[f32]>, l: &mut [u8], ls: &mut [u8]) -> f32 {
    let values = &KVALUES_IQ4NL;
    let sb = x.len();
    let mut sigma2 = 0f32;
    for &v in x {
        sigma2 += v * v;
    }
    sigma2 *= 2.0 / sb as f32;
    let nblocks = sb / 32;
    let mut scales = [0f32; QK_K / 32];
    let mut weight = [0f32; 32];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for ib in 0..nblocks {
        let xb = &x[32 * ib..32 * ib + 32];
        let lb = &mut l[32 * ib..32 * ib + 32];
        match qw {
            Some(q) => {
                for j in 0..32 {
                    weight[j] = q[32 * ib + j] * (sigma2 + xb[j] * xb[j]).sqrt();
                }
            }
            None => {
                for j in 0..32 {
                    weight[j] = xb[j] * xb[j];
                }
            }
        }
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax < GROUP_MAX_EPS {
            scales[ib] = 0.0;
            lb.fill(0);
            continue;
        }
        let v0 = values[0] as f32;
        let mut d = -max / v0;
        let mut id = 1.0 / d;
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for j in 0..32 {
            let k = best_index_int8(values, id * xb[j]);
            lb[j] = k as u8;
            let q = values[k] as f32;
            let w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -NTRY..=NTRY {
            id = (itry + values[0] as i32) as f32 / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for j in 0..32 {
                let q = values[best_index_int8(values, id * xb[j])] as f32;
                let w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if d.abs() > amax_scale {
            amax_scale = d.abs();
            max_scale = d;
        }
    }
    if nblocks > 1 {
        let d = -max_scale / 32.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for ib in 0..nblocks {
            let li = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * li as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 0..32 {
                l[32 * ib + j] = best_index_int8(values, idl * x[32 * ib + j]) as u8;
            }
            ls[ib] = (li + 32) as u8;
        }
        d
    } else {
        let id = if scales[0] != 0.0 {
            1.0 / scales[0]
        } else {
            0.0
        };
        for j in 0..sb {
            l[j] = best_index_int8(values, id * x[j]) as u8;
        }
        scales[0]
    }
}

/// Nibbles: byte `j` of each 32-block holds `j` low and `j + 16` high.
fn pack(l: &[u8], qs: &mut [u8]) {
    for i in 0..l.len() / 32 {
        for j in 0..16 {
            qs[16 * i + j] = l[32 * i + j] | (l[32 * i + 16 + j] << 4);
        }
    }
}

pub fn quantize_nl(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    let mut l = [0u8; 32];
    for (i, (xb, b)) in x.chunks_exact(32).zip(out.chunks_exact_mut(18)).enumerate() {
        let d = superblock(xb, qw.map(|q| &q[32 * i..32 * i + 32]), &mut l, &mut []);
        put_f16(b, 0, d);
        pack(&l, &mut b[2..18]);
    }
}

pub fn quantize_xs(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut ls = [0u8; QK_K / 32];
    for (i, (xb, b)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(136))
        .enumerate()
    {
        let d = superblock(
            xb,
            qw.map(|q| &q[QK_K * i..QK_K * (i + 1)]),
            &mut l,
            &mut ls,
        );
        put_f16(b, 0, d);
        let mut scales_h = 0u16;
        b[4..8].fill(0);
        for (ib, &s) in ls.iter().enumerate() {
            b[4 + ib / 2] |= (s & 0xf) << (4 * (ib % 2));
            scales_h |= ((s >> 4) as u16) << (2 * ib);
        }
        b[2..4].copy_from_slice(&scales_h.to_le_bytes());
        pack(&l, &mut b[8..136]);
    }
}
