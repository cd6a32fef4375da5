//! Q5_1 x Q8_1: unsigned 5-bit values; the minimum times Q8_1's `s`.

use std::arch::x86_64::*;

use super::{bit_bytes, block32_entries, f16_pair, nibbles, read_u32, Block32};
use crate::quant::{q5_1, q8_1};

pub(super) struct Q5_1;

impl Block32 for Q5_1 {
    const W: usize = q5_1::BLOCK;
    const A: usize = q8_1::BLOCK;
    const UNSIGNED: bool = true;
    const MIN: bool = true;
    // w <= 31: 8 products of at most 31 * 128 per lane.
    const OFFSET: i32 = 0;
    const FOLD: usize = 4;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8) -> __m256i {
        // SAFETY: a Q5_1 block has qh at 4..8 and 16 nibble bytes from 8.
        let (qh, q) = unsafe { (read_u32(p.add(4)), nibbles(p.add(8))) };
        let high = _mm256_and_si256(bit_bytes(qh), _mm256_set1_epi8(0x10));
        _mm256_or_si256(q, high)
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

block32_entries!(vec_dot_q5_1, tile_q5_1, gemm_q5_1, Q5_1);
