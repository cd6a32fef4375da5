//! Q3_K: 256 weights as 2 low bits plus a high-bit mask, 16 signed 6-bit
//! scales packed in 12 bytes, one f16 super-scale (110 bytes):
//! hmask[32], qs[64], scales[12], d.
//!
//! Element `e = 128h + 32k + l` takes bits `2k..2k+2` of `qs[32h + l]` and
//! bit `4h + k` of `hmask[l]`; a clear high bit subtracts 4. Its group is
//! `e / 16`. Dot products pair it with Q8_K activations.

use super::block::{dot_groups16, f16_at, f32_at, u32_at};
use super::{q8_k, QK_K};

pub const BLOCK: usize = 110;

/// The sixteen 6-bit scales, unpacked but not yet offset by -32.
pub fn unpack_scales(s: &[u8]) -> [u8; 16] {
    let (a0, a1, tmp) = (u32_at(s, 0), u32_at(s, 4), u32_at(s, 8));
    const K1: u32 = 0x0303_0303;
    const K2: u32 = 0x0f0f_0f0f;
    let aux = [
        (a0 & K2) | ((tmp & K1) << 4),
        (a1 & K2) | (((tmp >> 2) & K1) << 4),
        ((a0 >> 4) & K2) | (((tmp >> 4) & K1) << 4),
        ((a1 >> 4) & K2) | (((tmp >> 6) & K1) << 4),
    ];
    let mut out = [0u8; 16];
    for (i, v) in aux.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// The 256 signed 3-bit values (-4..=3) of one block, in element order.
#[inline]
pub fn values(b: &[u8]) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (e, v) in q.iter_mut().enumerate() {
        let (h, k, l) = (e / 128, (e / 32) % 4, e % 32);
        let low = ((b[32 + 32 * h + l] >> (2 * k)) & 3) as i8;
        let high = b[l] & (1 << (4 * h + k)) != 0;
        *v = if high { low } else { low - 4 };
    }
    q
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK_K)) {
        let (hm, qs) = (&b[0..32], &b[32..96]);
        let scales = unpack_scales(&b[96..108]);
        let d_all = f16_at(b, 108);
        let mut out = 0;
        let mut is = 0;
        let mut m = 1u8;
        for half in 0..2 {
            let q = &qs[half * 32..half * 32 + 32];
            for shift in [0u32, 2, 4, 6] {
                for part in 0..2 {
                    let dl = d_all * (scales[is] as i32 - 32) as f32;
                    is += 1;
                    for l in 0..16 {
                        let k = part * 16 + l;
                        let low = ((q[k] >> shift) & 3) as i32;
                        let sub = if hm[k] & m != 0 { 0 } else { 4 };
                        y[out] = dl * (low - sub) as f32;
                        out += 1;
                    }
                }
                m <<= 1;
            }
        }
    }
}

/// `(d * d_a) * sum_g (sc_g - 32) * dot_g`, integer inside a super-block.
pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w
        .chunks_exact(BLOCK)
        .zip(a.chunks_exact(q8_k::BLOCK))
        .take(n / QK_K)
    {
        let sc = unpack_scales(&bw[96..108]);
        let scales: [i32; 16] = std::array::from_fn(|g| sc[g] as i32 - 32);
        let isum = dot_groups16(&values(bw), &ba[4..260], &scales);
        sum += (f16_at(bw, 108) * f32_at(ba, 0)) * isum as f32;
    }
    sum
}
