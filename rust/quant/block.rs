//! Helpers shared by the block formats.

use half::f16;

#[inline]
pub fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Little-endian f32 at byte `i`.
#[inline]
pub fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Little-endian u32 at byte `i`.
#[inline]
pub fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Sum of `q[k] * a[k]` over two signed 8-bit slices.
#[inline]
pub fn dot_i8(q: &[i8], a: &[u8]) -> i32 {
    q.iter()
        .zip(a)
        .map(|(&x, &y)| x as i32 * (y as i8) as i32)
        .sum()
}

/// The K-quant integer kernel: `sum_g scales[g] * dot(q[16g..], a[16g..])`
/// over the sixteen groups of sixteen in one super-block.
#[inline]
pub fn dot_groups16(q: &[i8; 256], a: &[u8], scales: &[i32; 16]) -> i32 {
    let mut s = 0i32;
    for (g, sc) in scales.iter().enumerate() {
        s += sc * dot_i8(&q[16 * g..16 * g + 16], &a[16 * g..16 * g + 16]);
    }
    s
}

/// The sixteen little-endian i16 group sums of a Q8_K block.
#[inline]
pub fn q8k_bsums(b: &[u8]) -> [i32; 16] {
    std::array::from_fn(|g| i16::from_le_bytes([b[260 + 2 * g], b[261 + 2 * g]]) as i32)
}

#[inline]
pub fn put_f16(b: &mut [u8], i: usize, v: f32) {
    b[i..i + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

/// Rounds half to even, as ggml's x86 SIMD quantizers do (`_mm256_round_ps`
/// with nearest rounding), so our activations match llama.cpp's bit for bit.
///
/// Adding 1.5 * 2^23 leaves the rounded integer in the low mantissa bits
/// (exact for |v| < 2^22, which quantized values always are); unlike
/// `round_ties_even`, this needs no SSE4.1 and compiles inline on baseline
/// x86-64 instead of calling libm's `rintf`.
#[inline]
pub fn round_i8(v: f32) -> i8 {
    let bits = (v + 12_582_912.0f32).to_bits() as i32;
    ((bits & 0x007f_ffff) - 0x0040_0000) as i8
}

/// Scale and inverse scale for a symmetric 8-bit block with maximum `amax`,
/// computed in the same order as ggml (`127 / amax`, not `1 / d`).
#[inline]
pub fn q8_scales(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    (d, id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_i8_is_round_half_to_even() {
        for i in -1270..=1270 {
            let v = i as f32 / 10.0;
            assert_eq!(round_i8(v), v.round_ties_even() as i8, "{v}");
        }
        for v in [0.5f32, 1.5, 2.5, -0.5, -1.5, 126.5, -127.5, 127.0] {
            assert_eq!(round_i8(v), v.round_ties_even() as i8, "{v}");
        }
    }
}
