//! Activation quantization into Q8_0, Q8_1 and Q8_K, bit-equal to the
//! scalar twins (same scale arithmetic, nearest-even rounding).

use std::arch::x86_64::*;

use super::{hsum_i32, put_f16};
use crate::quant::block::q8_scales;
use crate::quant::{q8_0, q8_1, q8_k, QK_K};

/// Largest |x| over 32 floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn amax32(v: &[__m256; 4]) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let m = v.iter().fold(_mm256_setzero_ps(), |m, x| {
        _mm256_max_ps(m, _mm256_andnot_ps(sign, *x))
    });
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)))
}

/// round(v * id) for 32 floats, as 32 i8 in element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn round_pack(v: &[__m256; 4], id: f32) -> __m256i {
    let mul = _mm256_set1_ps(id);
    let q: [__m256i; 4] = std::array::from_fn(|k| {
        _mm256_cvtps_epi32(_mm256_round_ps::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(_mm256_mul_ps(v[k], mul)))
    });
    // packs work within 128-bit lanes; the permute restores element order.
    let p = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Sum of the 32 i8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sum_i8(q: __m256i) -> i32 {
    let ones8 = _mm256_set1_epi8(1);
    // Move each byte's sign onto the ones so maddubs can take |q| unsigned.
    let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(ones8, q));
    hsum_i32(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_blocks<const SUM: bool>(src: &[f32], dst: &mut [u8], block: usize) {
    let qoff = block - 32;
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(block)) {
        // SAFETY: x holds 32 floats.
        let v: [__m256; 4] =
            std::array::from_fn(|k| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * k)) });
        let (d, id) = q8_scales(amax32(&v));
        let q = round_pack(&v, id);
        // SAFETY: b holds 32 quant bytes from qoff.
        unsafe { _mm256_storeu_si256(b.as_mut_ptr().add(qoff) as *mut __m256i, q) };
        // SAFETY: F16C is enabled here.
        unsafe { put_f16(b, 0, d) };
        if SUM {
            // SAFETY: as above.
            unsafe { put_f16(b, 2, sum_i8(q) as f32 * d) };
        }
    }
}

pub fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    // SAFETY: features detected at install time; chunks bound every access.
    unsafe { q8_blocks::<false>(src, dst, q8_0::BLOCK) }
}

pub fn quantize_q8_1(src: &[f32], dst: &mut [u8]) {
    // SAFETY: features detected at install time; chunks bound every access.
    unsafe { q8_blocks::<true>(src, dst, q8_1::BLOCK) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_k_block(x: &[f32], b: &mut [u8]) {
    let p = x.as_ptr();
    // SAFETY (loads below): x holds QK_K floats, read 8 at a time.
    let ld = |k: usize| unsafe { _mm256_loadu_ps(p.add(8 * k)) };
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    for k in 0..QK_K / 8 {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, ld(k)));
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
    b.fill(0);
    if amax == 0.0 {
        return;
    }
    // The first element of largest magnitude, with its sign (as the scalar loop).
    let target = _mm256_set1_ps(amax);
    let mut max = amax;
    for k in 0..QK_K / 8 {
        let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
            _mm256_andnot_ps(sign, ld(k)),
            target,
        ));
        if hit != 0 {
            max = x[8 * k + hit.trailing_zeros() as usize];
            break;
        }
    }
    let iscale = -127.0 / max;
    let mul = _mm256_set1_ps(iscale);
    let cap = _mm256_set1_epi32(127);
    for g in 0..QK_K / 32 {
        let q: [__m256i; 4] = std::array::from_fn(|k| {
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(ld(4 * g + k), mul),
            );
            _mm256_min_epi32(_mm256_cvtps_epi32(r), cap)
        });
        // Group sums of 16: the two halves of this run of 32.
        let s0 = hsum_i32(_mm256_add_epi32(q[0], q[1]));
        let s1 = hsum_i32(_mm256_add_epi32(q[2], q[3]));
        b[260 + 4 * g..262 + 4 * g].copy_from_slice(&(s0 as i16).to_le_bytes());
        b[262 + 4 * g..264 + 4 * g].copy_from_slice(&(s1 as i16).to_le_bytes());
        let pk = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let pk = _mm256_permutevar8x32_epi32(pk, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: the block holds 256 quant bytes from offset 4.
        unsafe { _mm256_storeu_si256(b.as_mut_ptr().add(4 + 32 * g) as *mut __m256i, pk) };
    }
    b[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}

pub fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src
        .chunks_exact(QK_K)
        .zip(dst.chunks_exact_mut(q8_k::BLOCK))
    {
        // SAFETY: features detected at install time; x and b are whole blocks.
        unsafe { q8_k_block(x, b) }
    }
}
