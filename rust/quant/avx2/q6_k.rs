//! Q6_K x Q8_K: the unsigned 6-bit value (q + 32) in `maddubs`, the i8
//! group scale in `madd`, and 32 * sum_g scale_g * bsum_g subtracted once;
//! each super-block's integer becomes its float value as in the scalar
//! reference (`q6_k::vec_dot`), added in block order.

use std::arch::x86_64::*;

use super::{f16_at, hsum_i32, kquant_entries, load, load128, read_f32, scale_pair};
use crate::quant::{q6_k, q8_k};

/// Half `h` of a block's unsigned 6-bit values (q + 32): elements
/// `128h + 32k..128h + 32k + 32` in vector k.
///
/// # Safety
/// AVX2 is available and `bw` points at a whole Q6_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn half(bw: *const u8, h: usize) -> [__m256i; 4] {
    let m4 = _mm256_set1_epi8(0x0f);
    // SAFETY: ql is 0..128 and qh 128..192: 64 + 32 bytes per half.
    let (ql0, ql1, qh) = unsafe {
        (
            load(bw.add(64 * h)),
            load(bw.add(64 * h + 32)),
            load(bw.add(128 + 32 * h)),
        )
    };
    let bits = |m: i8| _mm256_and_si256(qh, _mm256_set1_epi8(m));
    [
        _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(bits(0x03), 4)),
        _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(bits(0x0c), 2)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), bits(0x30)),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
            _mm256_srli_epi16(bits(0xc0u8 as i8), 2),
        ),
    ]
}

/// One weight row against C activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot<const C: usize>(nb: usize, w: *const u8, a: [*const u8; C]) -> [f32; C] {
    let mut acc = [0f32; C];
    for i in 0..nb {
        // SAFETY: the caller guarantees nb whole blocks on every row.
        let bw = unsafe { w.add(i * q6_k::BLOCK) };
        // Decode streams the rows from memory one after another.
        crate::simd::prefetch_bytes(bw.wrapping_add(nb * q6_k::BLOCK), q6_k::BLOCK);
        // SAFETY: 16 scales at 192..208 and d at 208..210.
        let (scales8, d) = unsafe { (load128(bw.add(192)), f16_at(bw.add(208))) };
        let mut sumi = [_mm256_setzero_si256(); C];
        for h in 0..2 {
            // SAFETY: the caller guarantees a whole block at bw.
            let v = unsafe { half(bw, h) };
            for (k, vk) in v.iter().enumerate() {
                let s = scale_pair(scales8, 4 * h + k);
                for c in 0..C {
                    // SAFETY: a Q8_K block has 256 quants from offset 4.
                    let x = unsafe { load(a[c].add(i * q8_k::BLOCK + 4 + 128 * h + 32 * k)) };
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(*vk, x), s);
                    sumi[c] = _mm256_add_epi32(sumi[c], p);
                }
            }
        }
        let scales16 = _mm256_cvtepi8_epi16(scales8);
        for c in 0..C {
            // SAFETY: the scale is the block's first 4 bytes, the sums its last 32.
            let ba = unsafe { a[c].add(i * q8_k::BLOCK) };
            let (da, bsums) = unsafe { (read_f32(ba), load(ba.add(260))) };
            let offset = _mm256_slli_epi32(_mm256_madd_epi16(scales16, bsums), 5);
            let s = _mm256_sub_epi32(sumi[c], offset);
            // The scalar reference's block value, to the bit.
            acc[c] += (d * da) * hsum_i32(s) as f32;
        }
    }
    acc
}

kquant_entries!(vec_dot_q6_k, tile_q6_k, q6_k::BLOCK);
