//! Q4_K x Q8_K: unsigned nibbles, each 32-run scaled by its 6-bit scale in
//! the `madd`; the mins meet Q8_K's group sums once per super-block. Each
//! super-block's two integers become its float value exactly as in the
//! scalar reference (`q4_k::dot_block`), added in block order.

use std::arch::x86_64::*;

use super::{f16_pair, hsum_i32, hsum_i32x4, kquant_entries, load, load128, read_f32};
use crate::quant::kquant_scales::scales_mins;
use crate::quant::{q4_k, q8_k};

/// `sum_j bsum_j * min_{j/2}` from the 16 group sums and the 8 mins.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mins_dot(ba: *const u8, mins: __m128i) -> i32 {
    // SAFETY: a Q8_K block has its 16 i16 group sums at 260..292.
    let (lo, hi) = unsafe { (load128(ba.add(260)), load128(ba.add(276))) };
    // Pairs of 16-sums are the 32-sums the mins apply to.
    hsum_i32x4(_mm_madd_epi16(_mm_hadd_epi16(lo, hi), mins))
}

/// The block's scales as eight i16 broadcasts and its mins as 8 i16 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn unpack(packed: *const u8) -> ([__m256i; 8], __m128i) {
    // SAFETY: a Q4_K/Q5_K block has its 12 packed scale bytes at 4..16.
    let (sc, mn) = scales_mins(unsafe { std::slice::from_raw_parts(packed, 12) });
    let scales = std::array::from_fn(|j| _mm256_set1_epi16(((sc >> (8 * j)) & 0xff) as i16));
    (scales, _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64)))
}

/// One weight row against C activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot<const C: usize>(nb: usize, w: *const u8, a: [*const u8; C]) -> [f32; C] {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [0f32; C];
    for i in 0..nb {
        // SAFETY: the caller guarantees nb whole blocks on every row.
        let bw = unsafe { w.add(i * q4_k::BLOCK) };
        // Decode streams the rows from memory one after another.
        crate::simd::prefetch_bytes(bw.wrapping_add(nb * q4_k::BLOCK), q4_k::BLOCK);
        // SAFETY: d, dmin and the scales are the block's first 16 bytes.
        let (dm, (scales, mins)) = unsafe { (f16_pair(bw), unpack(bw.add(4))) };
        let mut sumi = [_mm256_setzero_si256(); C];
        for j in 0..4 {
            // SAFETY: 32 quant bytes per 64 elements from offset 16.
            let q = unsafe { load(bw.add(16 + 32 * j)) };
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            for c in 0..C {
                // SAFETY: a Q8_K block has 256 quants from offset 4.
                let (xl, xh) = unsafe {
                    let p = a[c].add(i * q8_k::BLOCK + 4 + 64 * j);
                    (load(p), load(p.add(32)))
                };
                let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), scales[2 * j]);
                let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), scales[2 * j + 1]);
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(pl, ph));
            }
        }
        for c in 0..C {
            // SAFETY: as above; the scale is the block's first 4 bytes.
            let ba = unsafe { a[c].add(i * q8_k::BLOCK) };
            let (da, summ) = unsafe { (read_f32(ba), mins_dot(ba, mins)) };
            let (dw, dmin) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 1)));
            // The scalar reference's block value, to the bit.
            acc[c] += (dw * da) * hsum_i32(sumi[c]) as f32 - (dmin * da) * summ as f32;
        }
    }
    acc
}

kquant_entries!(vec_dot_q4_k, tile_q4_k, q4_k::BLOCK);
