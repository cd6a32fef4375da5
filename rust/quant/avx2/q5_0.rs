//! Q5_0 x Q8_0: nibbles plus the fifth bit, minus 16, signed products.

use std::arch::x86_64::*;

use super::{bit_bytes, block32_entries, f16_pair, nibbles, read_u32, Block32};
use crate::quant::{q5_0, q8_0};

pub(super) struct Q5_0;

impl Block32 for Q5_0 {
    const W: usize = q5_0::BLOCK;
    const A: usize = q8_0::BLOCK;
    const UNSIGNED: bool = false;
    const MIN: bool = false;
    // |w| <= 16: 8 products of at most 16 * 128 per lane.
    const OFFSET: i32 = 16;
    const FOLD: usize = 4;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8) -> __m256i {
        // SAFETY: a Q5_0 block has qh at 2..6 and 16 nibble bytes from 6.
        let (qh, q) = unsafe { (read_u32(p.add(2)), nibbles(p.add(6))) };
        // (q | h << 4) - 16 is q where the bit is set and q | 0xF0 (= q - 16
        // as i8) where it is clear.
        let clear = _mm256_andnot_si256(bit_bytes(qh), _mm256_set1_epi8(0xF0u8 as i8));
        _mm256_or_si256(q, clear)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn uquants(p: *const u8) -> __m256i {
        // SAFETY: a Q5_0 block has qh at 2..6 and 16 nibble bytes from 6.
        let (qh, q) = unsafe { (read_u32(p.add(2)), nibbles(p.add(6))) };
        _mm256_or_si256(q, _mm256_and_si256(bit_bytes(qh), _mm256_set1_epi8(0x10)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: *const u8) -> __m128 {
        // SAFETY: the scale and qh are readable; lane 1 is unused.
        unsafe { f16_pair(p) }
    }
}

block32_entries!(vec_dot_q5_0, tile_q5_0, gemm_q5_0, Q5_0);
