//! AVX2 + FMA + F16C dot products. Installed by `mod.rs` only after run-time
//! detection, so a baseline x86-64 build still takes this path where it can.

use std::arch::x86_64::*;

use crate::simd::x86::hsum;

use super::{q4_1, q8_0, q8_1};

/// The two f16 fields at the start of a block (scale and min/sum) as lanes
/// 0 and 1. One 32-bit move, not two 16-bit lane inserts: `vpinsrw` merges
/// into a register, which the compiler may share with an accumulator and so
/// chain every block's scale load behind the previous block's FMA.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_pair(b: &[u8]) -> __m128 {
    let bits = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))
}

pub fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Eight i32 lane sums of unsigned(x) * signed(y) byte products, as f32.
#[target_feature(enable = "avx2,fma")]
unsafe fn mul_sum_us8(x: __m256i, y: __m256i) -> __m256 {
    let p16 = _mm256_maddubs_epi16(x, y);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
}

/// The same for two signed operands: move x's sign onto y so x can be unsigned.
#[target_feature(enable = "avx2,fma")]
unsafe fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256 {
    mul_sum_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// Expands 16 bytes of nibbles into 32 bytes: low nibbles then high nibbles.
#[target_feature(enable = "avx2,fma")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: callers pass a pointer to 16 readable bytes.
    let raw = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let m = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(raw, m);
    let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m);
    _mm256_set_m128i(hi, lo)
}

pub fn vec_dot_q4_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / q4_1::QK;
    assert!(w.len() >= nb * q4_1::BLOCK && a.len() >= nb * q8_1::BLOCK);
    // SAFETY: AVX2/FMA/F16C were detected before this table was installed,
    // and the assert above bounds every block access below.
    unsafe { q4_1_impl(nb, w, a) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_impl(nb: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = _mm_setzero_ps();
    for i in 0..nb {
        let bw = &w[i * q4_1::BLOCK..(i + 1) * q4_1::BLOCK];
        let ba = &a[i * q8_1::BLOCK..(i + 1) * q8_1::BLOCK];
        // SAFETY: bw has 20 bytes (16 nibble bytes from offset 4); ba has 36 (32 from offset 4).
        let (qw, qa) = unsafe {
            (
                nibbles(bw.as_ptr().add(4)),
                _mm256_loadu_si256(ba.as_ptr().add(4) as *const __m256i),
            )
        };
        // lane 0: d_w * d_a, lane 1: m_w * s_a
        let prod = _mm_mul_ps(f16_pair(bw), f16_pair(ba));
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), mul_sum_us8(qw, qa), acc);
        mins = _mm_add_ps(mins, prod);
    }
    hsum(acc) + _mm_cvtss_f32(_mm_shuffle_ps(mins, mins, 1))
}

pub fn vec_dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / q8_0::QK;
    assert!(w.len() >= nb * q8_0::BLOCK && a.len() >= nb * q8_0::BLOCK);
    // SAFETY: features detected at install time; the assert bounds all blocks.
    unsafe { q8_0_impl(nb, w, a) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_impl(nb: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let (bw, ba) = (&w[i * q8_0::BLOCK..], &a[i * q8_0::BLOCK..]);
        // SAFETY: each block holds 32 quant bytes from offset 2.
        let (x, y) = unsafe {
            (
                _mm256_loadu_si256(bw.as_ptr().add(2) as *const __m256i),
                _mm256_loadu_si256(ba.as_ptr().add(2) as *const __m256i),
            )
        };
        let d = _mm256_broadcastss_ps(_mm_mul_ps(f16_pair(bw), f16_pair(ba)));
        acc = _mm256_fmadd_ps(d, mul_sum_i8(x, y), acc);
    }
    hsum(acc)
}

pub fn vec_dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(w.len() >= n * 4 && a.len() >= n * 4);
    // SAFETY: features detected at install time; lengths asserted above.
    unsafe { f32_impl(n, w.as_ptr() as *const f32, a.as_ptr() as *const f32) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn f32_impl(n: usize, w: *const f32, a: *const f32) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    // SAFETY: i + 8 <= n keeps the unaligned loads within the n elements.
    while i + 8 <= n {
        unsafe { acc = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(i)), _mm256_loadu_ps(a.add(i)), acc) };
        i += 8;
    }
    let mut s = hsum(acc);
    while i < n {
        // SAFETY: i < n.
        unsafe { s += w.add(i).read_unaligned() * a.add(i).read_unaligned() };
        i += 1;
    }
    s
}

pub fn vec_dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(w.len() >= n * 2 && a.len() >= n * 4);
    // SAFETY: features detected at install time; lengths asserted above.
    unsafe { f16_impl(n, w.as_ptr() as *const u16, a.as_ptr() as *const f32) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_impl(n: usize, w: *const u16, a: *const f32) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    // SAFETY: i + 8 <= n keeps both loads within bounds.
    while i + 8 <= n {
        unsafe {
            let wv = _mm256_cvtph_ps(_mm_loadu_si128(w.add(i) as *const __m128i));
            acc = _mm256_fmadd_ps(wv, _mm256_loadu_ps(a.add(i)), acc);
        }
        i += 8;
    }
    let mut s = hsum(acc);
    while i < n {
        // SAFETY: i < n.
        unsafe {
            s +=
                half::f16::from_bits(w.add(i).read_unaligned()).to_f32() * a.add(i).read_unaligned()
        };
        i += 1;
    }
    s
}

/// Four Q4_1 rows against one Q8_1 activation row: the activation block is
/// loaded once per four rows and the four accumulators are independent, so
/// the FMA latency chain no longer bounds the loop.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_x4(nb: usize, w: [&[u8]; 4], a: &[u8]) -> [f32; 4] {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut mins = [_mm_setzero_ps(); 4];
    for i in 0..nb {
        let ba = &a[i * q8_1::BLOCK..(i + 1) * q8_1::BLOCK];
        // SAFETY: a Q8_1 block has 32 quant bytes from offset 4.
        let qa = unsafe { _mm256_loadu_si256(ba.as_ptr().add(4) as *const __m256i) };
        let dsa = f16_pair(ba);
        for r in 0..4 {
            let bw = &w[r][i * q4_1::BLOCK..(i + 1) * q4_1::BLOCK];
            // SAFETY: a Q4_1 block has 16 nibble bytes from offset 4.
            let qw = unsafe { nibbles(bw.as_ptr().add(4)) };
            let prod = _mm_mul_ps(f16_pair(bw), dsa);
            acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), mul_sum_us8(qw, qa), acc[r]);
            mins[r] = _mm_add_ps(mins[r], prod);
        }
    }
    let m = |v: __m128| _mm_cvtss_f32(_mm_shuffle_ps(v, v, 1));
    [
        hsum(acc[0]) + m(mins[0]),
        hsum(acc[1]) + m(mins[1]),
        hsum(acc[2]) + m(mins[2]),
        hsum(acc[3]) + m(mins[3]),
    ]
}

/// Four Q8_0 rows against one Q8_0 activation row (see `q4_1_x4`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_x4(nb: usize, w: [&[u8]; 4], a: &[u8]) -> [f32; 4] {
    let mut acc = [_mm256_setzero_ps(); 4];
    for i in 0..nb {
        let ba = &a[i * q8_0::BLOCK..(i + 1) * q8_0::BLOCK];
        // SAFETY: a Q8_0 block has 32 quant bytes from offset 2.
        let y = unsafe { _mm256_loadu_si256(ba.as_ptr().add(2) as *const __m256i) };
        let da = f16_pair(ba);
        for r in 0..4 {
            let bw = &w[r][i * q8_0::BLOCK..(i + 1) * q8_0::BLOCK];
            // SAFETY: as above for the weight block.
            let x = unsafe { _mm256_loadu_si256(bw.as_ptr().add(2) as *const __m256i) };
            let d = _mm256_broadcastss_ps(_mm_mul_ps(f16_pair(bw), da));
            acc[r] = _mm256_fmadd_ps(d, mul_sum_i8(x, y), acc[r]);
        }
    }
    [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])]
}

macro_rules! tile_x4 {
    ($name:ident, $x4:ident, $one:ident, $wblock:expr, $ablock:expr) => {
        /// `out[r * cols + c]`: four-row kernel where it fits, single rows otherwise.
        pub fn $name(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]) {
            let nb = n / 32;
            let nc = acts.len();
            assert!(out.len() >= w_rows.len() * nc);
            assert!(w_rows.iter().all(|w| w.len() >= nb * $wblock));
            assert!(acts.iter().all(|a| a.len() >= nb * $ablock));
            for (c, a) in acts.iter().enumerate() {
                if let [w0, w1, w2, w3] = w_rows {
                    // SAFETY: features detected at install time; sizes asserted above.
                    let r = unsafe { $x4(nb, [w0, w1, w2, w3], a) };
                    for (k, v) in r.iter().enumerate() {
                        out[k * nc + c] = *v;
                    }
                } else {
                    for (k, w) in w_rows.iter().enumerate() {
                        // SAFETY: as above.
                        out[k * nc + c] = unsafe { $one(nb, w, a) };
                    }
                }
            }
        }
    };
}

tile_x4!(tile_q4_1_x1, q4_1_x4, q4_1_impl, q4_1::BLOCK, q8_1::BLOCK);

/// Four Q4_1 rows against two activation rows (prefill): each weight
/// block's nibbles are expanded once and used for both tokens.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_x4x2(nb: usize, w: [&[u8]; 4], a: [&[u8]; 2]) -> [[f32; 2]; 4] {
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    let mut mins = [[_mm_setzero_ps(); 2]; 4];
    for i in 0..nb {
        let ba0 = &a[0][i * q8_1::BLOCK..(i + 1) * q8_1::BLOCK];
        let ba1 = &a[1][i * q8_1::BLOCK..(i + 1) * q8_1::BLOCK];
        // SAFETY: Q8_1 blocks hold 32 quant bytes from offset 4.
        let (qa0, qa1) = unsafe {
            (
                _mm256_loadu_si256(ba0.as_ptr().add(4) as *const __m256i),
                _mm256_loadu_si256(ba1.as_ptr().add(4) as *const __m256i),
            )
        };
        let (ds0, ds1) = (f16_pair(ba0), f16_pair(ba1));
        for r in 0..4 {
            let bw = &w[r][i * q4_1::BLOCK..(i + 1) * q4_1::BLOCK];
            // SAFETY: a Q4_1 block has 16 nibble bytes from offset 4.
            let qw = unsafe { nibbles(bw.as_ptr().add(4)) };
            let dm = f16_pair(bw);
            let (p0, p1) = (_mm_mul_ps(dm, ds0), _mm_mul_ps(dm, ds1));
            acc[r][0] = _mm256_fmadd_ps(_mm256_broadcastss_ps(p0), mul_sum_us8(qw, qa0), acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(_mm256_broadcastss_ps(p1), mul_sum_us8(qw, qa1), acc[r][1]);
            mins[r][0] = _mm_add_ps(mins[r][0], p0);
            mins[r][1] = _mm_add_ps(mins[r][1], p1);
        }
    }
    let m = |v: __m128| _mm_cvtss_f32(_mm_shuffle_ps(v, v, 1));
    let mut out = [[0f32; 2]; 4];
    for r in 0..4 {
        for c in 0..2 {
            out[r][c] = hsum(acc[r][c]) + m(mins[r][c]);
        }
    }
    out
}

/// Q4_1 tile: pairs of tokens through the 4x2 kernel, the rest through 4x1.
pub fn tile_q4_1(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]) {
    let nb = n / 32;
    let nc = acts.len();
    let full = w_rows.len() == 4
        && w_rows.iter().all(|w| w.len() >= nb * q4_1::BLOCK)
        && acts.iter().all(|a| a.len() >= nb * q8_1::BLOCK)
        && out.len() >= 4 * nc;
    if !full || nc < 2 {
        tile_q4_1_x1(n, w_rows, acts, out);
        return;
    }
    let w = [w_rows[0], w_rows[1], w_rows[2], w_rows[3]];
    let mut c = 0;
    while c + 2 <= nc {
        // SAFETY: features detected at install time; sizes checked above.
        let r = unsafe { q4_1_x4x2(nb, w, [acts[c], acts[c + 1]]) };
        for (k, pair) in r.iter().enumerate() {
            out[k * nc + c] = pair[0];
            out[k * nc + c + 1] = pair[1];
        }
        c += 2;
    }
    if c < nc {
        // SAFETY: as above.
        let r = unsafe { q4_1_x4(nb, w, acts[c]) };
        for (k, v) in r.iter().enumerate() {
            out[k * nc + c] = *v;
        }
    }
}
tile_x4!(tile_q8_0, q8_0_x4, q8_0_impl, q8_0::BLOCK, q8_0::BLOCK);
