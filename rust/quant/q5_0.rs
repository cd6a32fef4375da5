//! Q5_0: 4 low bits in nibbles plus a 32-bit mask of fifth bits, offset 16,
//! one f16 scale (22 bytes). Dot products pair it with Q8_0 activations.

use super::block::{f16_at, u32_at};
use super::q8_0;

pub const QK: usize = 32;
pub const BLOCK: usize = 22;

/// The 32 signed values of one block, in element order.
#[inline]
fn values(b: &[u8]) -> [i32; 32] {
    let qh = u32_at(b, 2);
    let mut v = [0i32; 32];
    for j in 0..16 {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        v[j] = ((b[6 + j] & 0x0f) as u32 | h0) as i32 - 16;
        v[j + 16] = ((b[6 + j] >> 4) as u32 | h1) as i32 - 16;
    }
    v
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (x, q) in o.iter_mut().zip(values(b)) {
            *x = d * q as f32;
        }
    }
}

pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w
        .chunks_exact(BLOCK)
        .zip(a.chunks_exact(q8_0::BLOCK))
        .take(n / QK)
    {
        let s: i32 = values(bw)
            .iter()
            .zip(&ba[2..])
            .map(|(&x, &y)| x * (y as i8 as i32))
            .sum();
        sum += (f16_at(bw, 0) * f16_at(ba, 0)) * s as f32;
    }
    sum
}
