//! MXFP4 (OCP microscaling): 32 weights as e2m1 values (4 bits) and one
//! shared power-of-two scale in e8m0 (17 bytes): e, then qs as in IQ4_NL
//! (byte j holds element j low and j+16 high). The values are stored
//! doubled (`KVALUES_MXFP4`), so the scale is read as half of `2^(e-127)`.
//! Pairs with Q8_0.

use super::block::f16_at;
use super::iq4_nl::block_isum;
use super::iq_common::KVALUES_MXFP4;
use super::q8_0;

pub const QK: usize = 32;
pub const BLOCK: usize = 17;

/// ggml's `GGML_E8M0_TO_FP32_HALF`: `2^(e-128)`, exact for every `e`
/// (subnormal below e = 2).
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(QK)) {
        let d = e8m0_half(b[0]);
        for j in 0..16 {
            o[j] = KVALUES_MXFP4[(b[1 + j] & 0x0f) as usize] as f32 * d;
            o[j + 16] = KVALUES_MXFP4[(b[1 + j] >> 4) as usize] as f32 * d;
        }
    }
}

/// `sum_blocks (d_a * d_w) * isum`, in block order.
pub fn vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w
        .chunks_exact(BLOCK)
        .zip(a.chunks_exact(q8_0::BLOCK))
        .take(n / QK)
    {
        let s = block_isum(&bw[1..], &ba[2..], &KVALUES_MXFP4);
        sum += f16_at(ba, 0) * e8m0_half(bw[0]) * s as f32;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_two_to_e_minus_128() {
        for e in 0..=255u8 {
            assert_eq!(e8m0_half(e) as f64, 2f64.powi(e as i32 - 128), "e={e}");
        }
    }
}
