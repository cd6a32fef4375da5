//! Q8_K: activation format of the K-quants: f32 scale, 256 int8, and 16
//! partial sums of 16 (292 bytes).

use super::block::round_i8;

pub const BLOCK: usize = 292;

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(256)) {
        let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        for (x, &q) in o.iter_mut().zip(&b[4..260]) {
            *x = d * (q as i8) as f32;
        }
    }
}

pub fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(256).zip(dst.chunks_exact_mut(BLOCK)) {
        // The signed value of largest magnitude maps to -128, as in ggml.
        let mut max = 0f32;
        for &v in x {
            if v.abs() > max.abs() {
                max = v;
            }
        }
        b.fill(0);
        if max == 0.0 {
            continue;
        }
        let iscale = -128.0 / max;
        let mut sums = [0i32; 16];
        for (j, &v) in x.iter().enumerate() {
            let q = round_i8((iscale * v).clamp(-128.0, 127.0));
            b[4 + j] = q as u8;
            sums[j / 16] += q as i32;
        }
        b[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        for (k, s) in sums.iter().enumerate() {
            b[260 + 2 * k..262 + 2 * k].copy_from_slice(&(*s as i16).to_le_bytes());
        }
    }
}
