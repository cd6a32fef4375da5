//! Q2_K x Q8_K: 2-bit values in `maddubs`, the 4-bit group scale in `madd`,
//! the 4-bit group mins against Q8_K's group sums once per super-block.

use std::arch::x86_64::*;

use super::{f16_pair, hsum, hsum_i32, kquant_entries, load, load128, read_f32, scale_pair};
use crate::quant::{q2_k, q8_k};

/// One weight row against C activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot<const C: usize>(nb: usize, w: *const u8, a: [*const u8; C]) -> [f32; C] {
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); C];
    let mut acc_min = [0f32; C];
    for i in 0..nb {
        // SAFETY: the caller guarantees nb whole blocks on every row.
        let bw = unsafe { w.add(i * q2_k::BLOCK) };
        // SAFETY: scales at 0..16, d and dmin at 80..84.
        let (packed, dm) = unsafe { (load128(bw), f16_pair(bw.add(80))) };
        let scales8 = _mm_and_si128(packed, m4);
        let mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
        let mut sumi = [_mm256_setzero_si256(); C];
        for h in 0..2 {
            // SAFETY: 32 quant bytes per 128 elements from offset 16.
            let q = unsafe { load(bw.add(16 + 32 * h)) };
            let v = [
                _mm256_and_si256(q, m3),
                _mm256_and_si256(_mm256_srli_epi16(q, 2), m3),
                _mm256_and_si256(_mm256_srli_epi16(q, 4), m3),
                _mm256_and_si256(_mm256_srli_epi16(q, 6), m3),
            ];
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
        for c in 0..C {
            // SAFETY: the scale is the block's first 4 bytes, the sums its last 32.
            let ba = unsafe { a[c].add(i * q8_k::BLOCK) };
            let (da, bsums) = unsafe { (read_f32(ba), load(ba.add(260))) };
            let summs = hsum_i32(_mm256_madd_epi16(mins16, bsums));
            let d = _mm_cvtss_f32(dm) * da;
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
            acc_min[c] += _mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 1)) * da * summs as f32;
        }
    }
    std::array::from_fn(|c| hsum(acc[c]) - acc_min[c])
}

kquant_entries!(vec_dot_q2_k, tile_q2_k, q2_k::BLOCK);
