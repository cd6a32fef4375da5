//! MXFP4 x Q8_0: e2m1 nibbles looked up as doubled integers (one
//! `pshufb`), signed products, and the power-of-two scale built from its
//! exponent byte.

use std::arch::x86_64::*;

use super::iq4_nl::table;
use super::{block32_entries, nibbles, Block32};
use crate::quant::iq_common::KVALUES_MXFP4;
use crate::quant::{mxfp4, q8_0};

pub(super) struct Mxfp4;

impl Block32 for Mxfp4 {
    const W: usize = mxfp4::BLOCK;
    const A: usize = q8_0::BLOCK;
    const UNSIGNED: bool = false;
    const MIN: bool = false;
    // |w| <= 12: eight products of at most 12 * 128 per i16 lane.
    const OFFSET: i32 = 12;
    const FOLD: usize = 8;
    const F16_SCALES: bool = false;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8) -> __m256i {
        // SAFETY: an MXFP4 block has 16 nibble bytes from offset 1.
        unsafe { _mm256_shuffle_epi8(table(&KVALUES_MXFP4), nibbles(p.add(1))) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn uquants(p: *const u8) -> __m256i {
        // SAFETY: as `quants`.
        let q = unsafe { Self::quants(p) };
        _mm256_add_epi8(q, _mm256_set1_epi8(12))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8) -> __m128 {
        // SAFETY: the exponent is the block's first byte.
        _mm_set_ss(mxfp4::e8m0_half(unsafe { *p }))
    }
}

block32_entries!(vec_dot_mxfp4, tile_mxfp4, gemm_mxfp4, Mxfp4);
