//! Q8_0 x Q8_0: signed bytes on both sides.

use std::arch::x86_64::*;

use super::{block32_entries, f16_pair, load, Block32};
use crate::quant::q8_0;

pub(super) struct Q8_0;

impl Block32 for Q8_0 {
    const W: usize = q8_0::BLOCK;
    const A: usize = q8_0::BLOCK;
    const UNSIGNED: bool = false;
    const MIN: bool = false;
    // |w| <= 128: two products already fill an i16 lane.
    const OFFSET: i32 = 128;
    const FOLD: usize = 1;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8) -> __m256i {
        // SAFETY: a Q8_0 block has 32 quant bytes from offset 2.
        unsafe { load(p.add(2)) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn uquants(p: *const u8) -> __m256i {
        // SAFETY: a Q8_0 block has 32 quant bytes from offset 2.
        let q = unsafe { load(p.add(2)) };
        _mm256_xor_si256(q, _mm256_set1_epi8(0x80u8 as i8))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8) -> __m128 {
        // SAFETY: the scale and the first quants are readable; lane 1 is unused.
        unsafe { f16_pair(p) }
    }
}

block32_entries!(vec_dot_q8_0, tile_q8_0, gemm_q8_0, Q8_0);
