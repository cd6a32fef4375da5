//! Q5_K x Q8_K: Q4_K's kernel with the fifth bit ORed in as 16.

use std::arch::x86_64::*;

use super::q4_k::{mins_dot, unpack};
use super::{f16_pair, hsum, kquant_entries, load, read_f32};
use crate::quant::{q5_k, q8_k};

/// 16 in the bytes whose bit `b` of `qh` is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn high16(qh: __m256i, b: usize) -> __m256i {
    let bit = _mm256_and_si256(qh, _mm256_set1_epi8((1u8 << b) as i8));
    let clear = _mm256_cmpeq_epi8(bit, _mm256_setzero_si256());
    _mm256_andnot_si256(clear, _mm256_set1_epi8(16))
}

/// One weight row against C activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot<const C: usize>(nb: usize, w: *const u8, a: [*const u8; C]) -> [f32; C] {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); C];
    let mut acc_min = [0f32; C];
    for i in 0..nb {
        // SAFETY: the caller guarantees nb whole blocks on every row.
        let bw = unsafe { w.add(i * q5_k::BLOCK) };
        // SAFETY: d, dmin, the scales and qh are the block's first 48 bytes.
        let (dm, (scales, mins), qh) =
            unsafe { (f16_pair(bw), unpack(bw.add(4)), load(bw.add(16))) };
        let mut sumi = [_mm256_setzero_si256(); C];
        for j in 0..4 {
            // SAFETY: 32 low-bit bytes per 64 elements from offset 48.
            let q = unsafe { load(bw.add(48 + 32 * j)) };
            let lo = _mm256_or_si256(_mm256_and_si256(q, m4), high16(qh, 2 * j));
            let hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                high16(qh, 2 * j + 1),
            );
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
            let d = _mm_cvtss_f32(dm) * da;
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
            acc_min[c] += _mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 1)) * da * summ as f32;
        }
    }
    std::array::from_fn(|c| hsum(acc[c]) - acc_min[c])
}

kquant_entries!(vec_dot_q5_k, tile_q5_k, q5_k::BLOCK);
