//! TQ2_0: 256 ternary weights in 2.0625 bits (66 bytes): 64 bytes of four
//! 2-bit values, then an f16 scale `d`. Within each 32-byte half, bits
//! `2l..2l+2` of byte `m` are element `32l + m` of that half's 128. A
//! weight is `d * (q - 1)`. Pairs with Q8_K.

use super::block::f16_at;
use super::iq_common::{dot_rows, Decoded};
use super::QK_K;

pub const BLOCK: usize = 66;

/// The 256 weights' `q - 1`, in element order.
pub fn values(b: &[u8], q: &mut [i8; QK_K]) {
    for half in 0..2 {
        for l in 0..4 {
            for m in 0..32 {
                q[128 * half + 32 * l + m] = ((b[32 * half + m] >> (2 * l)) & 3) as i8 - 1;
            }
        }
    }
}

pub fn decode(b: &[u8], dec: &mut Decoded) {
    values(b, &mut dec.q);
    dec.scales = [1; 16];
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    let mut q = [0i8; QK_K];
    for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 64);
        values(b, &mut q);
        for (o, &v) in y.iter_mut().zip(&q) {
            *o = v as f32 * d;
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_rows(n, w, a, BLOCK, 64, 1.0, decode)
}
