//! Q4_0 x Q8_0: nibbles minus 8, signed products.

use std::arch::x86_64::*;

use super::{block32_entries, f16_pair, nibbles, Block32};
use crate::quant::{q4_0, q8_0};

pub(super) struct Q4_0;

impl Block32 for Q4_0 {
    const W: usize = q4_0::BLOCK;
    const A: usize = q8_0::BLOCK;
    const UNSIGNED: bool = false;
    const MIN: bool = false;
    // |w| <= 8: 16 products of at most 8 * 128 per lane.
    const OFFSET: i32 = 8;
    const FOLD: usize = 8;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8) -> __m256i {
        // SAFETY: a Q4_0 block has 16 nibble bytes from offset 2.
        let q = unsafe { nibbles(p.add(2)) };
        _mm256_sub_epi8(q, _mm256_set1_epi8(8))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn uquants(p: *const u8) -> __m256i {
        // SAFETY: a Q4_0 block has 16 nibble bytes from offset 2.
        unsafe { nibbles(p.add(2)) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8) -> __m128 {
        // SAFETY: the scale and the first quant bytes are readable; lane 1 is unused.
        unsafe { f16_pair(p) }
    }
}

block32_entries!(vec_dot_q4_0, tile_q4_0, gemm_q4_0, Q4_0);
