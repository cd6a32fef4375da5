//! Q3_K: 256 weights as 2 low bits plus a high-bit mask, 16 signed 6-bit
//! scales packed in 12 bytes, one f16 super-scale (110 bytes).

use super::block::f16_at;

pub const BLOCK: usize = 110;

fn unpack_scales(s: &[u8]) -> [i8; 16] {
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a0, a1, tmp) = (w(0), w(1), w(2));
    const K1: u32 = 0x0303_0303;
    const K2: u32 = 0x0f0f_0f0f;
    let aux = [
        (a0 & K2) | ((tmp & K1) << 4),
        (a1 & K2) | (((tmp >> 2) & K1) << 4),
        ((a0 >> 4) & K2) | (((tmp >> 4) & K1) << 4),
        ((a1 >> 4) & K2) | (((tmp >> 6) & K1) << 4),
    ];
    let mut out = [0i8; 16];
    for (i, v) in aux.iter().enumerate() {
        for (k, byte) in v.to_le_bytes().iter().enumerate() {
            out[4 * i + k] = *byte as i8;
        }
    }
    out
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(256)) {
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
