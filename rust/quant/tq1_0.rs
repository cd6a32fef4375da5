//! TQ1_0: 256 ternary weights in 1.6875 bits (54 bytes): 48 bytes of five
//! trits each, 4 bytes of four trits each, then an f16 scale `d`. A byte
//! `q` holds its trits in base 3, scaled so that the `n`-th trit is the
//! top "digit" of `q * 3^n` (mod 256), read as `(x * 3) >> 8`. A weight is
//! `d * (trit - 1)`. Element order: the first 32 bytes give five runs of
//! 32, the next 16 five runs of 16, the last 4 four runs of 4. Pairs with
//! Q8_K.

use super::block::f16_at;
use super::iq_common::{dot_rows, Decoded};
use super::QK_K;

pub const BLOCK: usize = 54;

const POW3: [u8; 6] = [1, 3, 9, 27, 81, 243];

#[inline]
fn trit(q: u8, n: usize) -> i8 {
    let x = q.wrapping_mul(POW3[n]);
    ((x as u16 * 3) >> 8) as i8 - 1
}

/// The 256 weights' `trit - 1`, in element order.
pub fn values(b: &[u8], q: &mut [i8; QK_K]) {
    let mut e = 0;
    // Five runs of 32 from bytes 0..32, five of 16 from 32..48, four of 4
    // from 48..52: run n of a group holds each byte's n-th trit.
    for (bytes, runs) in [(&b[..32], 5), (&b[32..48], 5), (&b[48..52], 4)] {
        for n in 0..runs {
            for &byte in bytes {
                q[e] = trit(byte, n);
                e += 1;
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
        let d = f16_at(b, 52);
        values(b, &mut q);
        for (o, &v) in y.iter_mut().zip(&q) {
            *o = v as f32 * d;
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_rows(n, w, a, BLOCK, 52, 1.0, decode)
}
