//! Q3_K x Q8_K: the unsigned value (q + 4, 0..=7) in `maddubs`, the signed
//! 6-bit group scale in `madd`, and 4 * sum_g scale_g * bsum_g subtracted
//! once per super-block (one `maddubs` per run instead of two).

use std::arch::x86_64::*;

use super::{f16_at, hsum, kquant_entries, load, load128, read_f32, scale_pair};
use crate::quant::q3_k::unpack_scales;
use crate::quant::{q3_k, q8_k};

/// 4 in the bytes whose bit `b` of `hm` is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn high4(hm: __m256i, b: usize) -> __m256i {
    let bit = _mm256_and_si256(hm, _mm256_set1_epi8((1u8 << b) as i8));
    let clear = _mm256_cmpeq_epi8(bit, _mm256_setzero_si256());
    _mm256_andnot_si256(clear, _mm256_set1_epi8(4))
}

/// One weight row against C activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot<const C: usize>(nb: usize, w: *const u8, a: [*const u8; C]) -> [f32; C] {
    let m3 = _mm256_set1_epi8(3);
    let mut acc = [_mm256_setzero_ps(); C];
    for i in 0..nb {
        // SAFETY: the caller guarantees nb whole blocks on every row.
        let bw = unsafe { w.add(i * q3_k::BLOCK) };
        // SAFETY: hmask 0..32, scales 96..108, d 108..110.
        let (hm, packed, d) = unsafe {
            (
                load(bw),
                std::slice::from_raw_parts(bw.add(96), 12),
                f16_at(bw.add(108)),
            )
        };
        let raw = unpack_scales(packed);
        // SAFETY: `raw` is a 16-byte array.
        let scales8 = _mm_sub_epi8(unsafe { load128(raw.as_ptr()) }, _mm_set1_epi8(32));
        let mut sumi = [_mm256_setzero_si256(); C];
        for h in 0..2 {
            // SAFETY: 32 low-bit bytes per 128 elements from offset 32.
            let q = unsafe { load(bw.add(32 + 32 * h)) };
            let low = [
                _mm256_and_si256(q, m3),
                _mm256_and_si256(_mm256_srli_epi16(q, 2), m3),
                _mm256_and_si256(_mm256_srli_epi16(q, 4), m3),
                _mm256_and_si256(_mm256_srli_epi16(q, 6), m3),
            ];
            for (k, lk) in low.iter().enumerate() {
                let v = _mm256_or_si256(*lk, high4(hm, 4 * h + k));
                let s = scale_pair(scales8, 4 * h + k);
                for c in 0..C {
                    // SAFETY: a Q8_K block has 256 quants from offset 4.
                    let x = unsafe { load(a[c].add(i * q8_k::BLOCK + 4 + 128 * h + 32 * k)) };
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(v, x), s);
                    sumi[c] = _mm256_add_epi32(sumi[c], p);
                }
            }
        }
        let scales16 = _mm256_cvtepi8_epi16(scales8);
        for c in 0..C {
            // SAFETY: the scale is the block's first 4 bytes, the sums its last 32.
            let ba = unsafe { a[c].add(i * q8_k::BLOCK) };
            let (da, bsums) = unsafe { (read_f32(ba), load(ba.add(260))) };
            let offset = _mm256_slli_epi32(_mm256_madd_epi16(scales16, bsums), 2);
            let s = _mm256_sub_epi32(sumi[c], offset);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d * da), _mm256_cvtepi32_ps(s), acc[c]);
        }
    }
    std::array::from_fn(|c| hsum(acc[c]))
}

kquant_entries!(vec_dot_q3_k, tile_q3_k, q3_k::BLOCK);
