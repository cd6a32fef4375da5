//! What the i-quants and ternary formats share: ggml's sign table, the
//! non-linear 4-bit codebooks, and the integer dot of a decoded
//! super-block with a Q8_K block.
//!
//! Every Q8_K-partnered format here is computed the same way: a block is
//! decoded into its 256 signed integer values and sixteen integer group
//! scales, the integer sum is exact, and only then does it meet the
//! floats. The SIMD kernels form the same integers, so they give the
//! scalar kernels' bits.

use super::block::{dot_groups16, f32_at};
use super::{q8_k, QK_K};

/// ggml's `kvalues_iq4nl`: the 16 levels of IQ4_NL and IQ4_XS.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// ggml's `kvalues_mxfp4`: the e2m1 values doubled (the half goes into
/// the block's scale).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml's `ksigns_iq2xs`: seven stored sign bits and an eighth that makes
/// the number of minus signs even.
pub const fn ksigns(i: usize) -> u8 {
    (i as u8 & 127) | (((i as u8 & 127).count_ones() as u8 & 1) << 7)
}

/// `v` with its sign flipped where bit `j` of `signs` is set.
#[inline]
pub fn signed(v: i8, signs: u8, j: usize) -> i8 {
    if signs & (1 << j) != 0 {
        -v
    } else {
        v
    }
}

/// A decoded super-block: its values and the integer scale of each group
/// of sixteen.
pub struct Decoded {
    pub q: [i8; QK_K],
    pub scales: [i32; 16],
}

impl Decoded {
    pub fn new() -> Self {
        Decoded {
            q: [0; QK_K],
            scales: [0; 16],
        }
    }

    /// One scale for both groups of sixteen in 32-element sub-block `ib`.
    #[inline]
    pub fn scale32(&mut self, ib: usize, s: i32) {
        self.scales[2 * ib] = s;
        self.scales[2 * ib + 1] = s;
    }

    /// `sum_g scales[g] * dot(q[16g..], a[16g..])` against a Q8_K block.
    #[inline]
    pub fn isum(&self, ba: &[u8]) -> i32 {
        dot_groups16(&self.q, &ba[4..4 + QK_K], &self.scales)
    }
}

/// `sum_blocks ((d_w * factor) * d_a) * isum` over the row, from +0.0 and
/// in block order (the order every SIMD twin keeps), for a format whose
/// block is `block` bytes with its f16 scale at `d_at` and decoded by
/// `decode`. `factor` is the power of two ggml applies to the row's sum
/// (1/8 for the IQ2 formats): applied to `d_w` it scales every term
/// exactly as it would the sum, and every kernel can apply it there.
#[inline]
pub fn dot_rows(
    n: usize,
    w: &[u8],
    a: &[u8],
    block: usize,
    d_at: usize,
    factor: f32,
    decode: impl Fn(&[u8], &mut Decoded),
) -> f32 {
    let mut sum = 0f32;
    let mut dec = Decoded::new();
    for (bw, ba) in w
        .chunks_exact(block)
        .zip(a.chunks_exact(q8_k::BLOCK))
        .take(n / QK_K)
    {
        decode(bw, &mut dec);
        let d = (super::block::f16_at(bw, d_at) * factor) * f32_at(ba, 0);
        sum += d * dec.isum(ba) as f32;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ksigns_have_even_parity() {
        for i in 0..128 {
            assert_eq!(ksigns(i).count_ones() % 2, 0);
            assert_eq!(ksigns(i) & 127, i as u8);
        }
        assert_eq!(ksigns(1), 0x81);
        assert_eq!(ksigns(3), 0x03);
    }
}
