//! IQ4_NL x Q8_0: nibbles looked up in the non-linear codebook (one
//! `pshufb`), signed products.

use std::arch::x86_64::*;

use super::{block32_entries, f16_pair, load128, nibbles, Block32};
use crate::quant::iq_common::KVALUES_IQ4NL;
use crate::quant::{iq4_nl, q8_0};

pub(super) struct Iq4Nl;

/// The codebook in both 128-bit lanes, as `pshufb` reads it.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn table(values: &[i8; 16]) -> __m256i {
    // SAFETY: 16 bytes.
    let t = unsafe { load128(values.as_ptr() as *const u8) };
    _mm256_set_m128i(t, t)
}

impl Block32 for Iq4Nl {
    const W: usize = iq4_nl::BLOCK;
    const A: usize = q8_0::BLOCK;
    const UNSIGNED: bool = false;
    const MIN: bool = false;
    // |w| <= 127: two products of at most 127 * 128 per i16 lane, so every
    // `maddubs` result is widened at once; the unsigned form adds 128.
    const OFFSET: i32 = 128;
    const FOLD: usize = 1;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8) -> __m256i {
        // SAFETY: an IQ4_NL block has 16 nibble bytes from offset 2.
        unsafe { _mm256_shuffle_epi8(table(&KVALUES_IQ4NL), nibbles(p.add(2))) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn uquants(p: *const u8) -> __m256i {
        // SAFETY: as `quants`.
        let q = unsafe { Self::quants(p) };
        _mm256_xor_si256(q, _mm256_set1_epi8(-128))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8) -> __m128 {
        // SAFETY: the scale and the first quant bytes are readable; lane 1 is unused.
        unsafe { f16_pair(p) }
    }
}

block32_entries!(vec_dot_iq4_nl, tile_iq4_nl, gemm_iq4_nl, Iq4Nl);
