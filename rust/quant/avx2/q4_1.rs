//! Q4_1 x Q8_1: unsigned nibbles; the minimum times Q8_1's `s` per block.

use std::arch::x86_64::*;

use super::{block32_entries, f16_pair, nibbles, Block32};
use crate::quant::{q4_1, q8_1};

pub(super) struct Q4_1;

impl Block32 for Q4_1 {
    const W: usize = q4_1::BLOCK;
    const A: usize = q8_1::BLOCK;
    const UNSIGNED: bool = true;
    const MIN: bool = true;
    // w <= 15: 16 products of at most 15 * 128 per lane.
    const OFFSET: i32 = 0;
    const FOLD: usize = 8;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8) -> __m256i {
        // SAFETY: a Q4_1 block has 16 nibble bytes from offset 4.
        unsafe { nibbles(p.add(4)) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn uquants(p: *const u8) -> __m256i {
        // SAFETY: as `quants`; the values are unsigned already.
        unsafe { Self::quants(p) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8) -> __m128 {
        // SAFETY: d and m are the block's first four bytes.
        unsafe { f16_pair(p) }
    }
}

block32_entries!(vec_dot_q4_1, tile_q4_1, gemm_q4_1, Q4_1);
