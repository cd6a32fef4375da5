//! The K-quant GEMM on CPUs with AVX-512 VNNI: sixteen weight rows in
//! the sixteen lanes of a 512-bit vector, against the activation rows
//! themselves (no panel).
//!
//! Why this shape: the AVX2 kernel (`kgemm.rs`) puts eight tokens in the
//! lanes and broadcasts one row's four weight bytes per group, so each
//! group costs a `maddubs`, a scale `madd` and an add for 32 products.
//! Here a row group is decoded and transposed once per call (vector `jj`
//! of a super-block holds elements `4jj..4jj + 4` of each of the sixteen
//! rows), after which a group costs one `vpdpbusd` for 64 products (the
//! token's four bytes broadcast from its own Q8_K row), a scale group one
//! `vpmulld` and one add, and each weight vector is loaded once for eight
//! tokens.
//!
//! Bits: as every kernel of these formats (see `kgemm.rs`), each
//! super-block's integer sums are exact (in any order: no partial sum can
//! overflow, and `vpdpbusd`/`vpdpwssd` wrap rather than saturate), its
//! value is `(d_w * d_a) * isum - (dmin_w * d_a) * summ` and the values
//! add in block order from +0.0, lane by lane, as the scalar reference
//! does row by row.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::super::{read_f32, read_u32};
use super::{KFormat, C, DEC};
use crate::quant::{q8_k, QK_K};

/// Weight rows per group: the sixteen i32 lanes.
const ROWS: usize = 16;

/// Tokens per pass: each weight and scale vector is loaded once for them.
const TOKENS: usize = 8;

/// A transposed super-block of a row group: word `w` of the sixteen
/// decoded blocks (`DEC / 4` words each: 64 of values, 16 of scales (as
/// i32), 8 of corrections) at `64 * w`, then the sixteen `d` and the
/// sixteen `dmin` as f32.
const WORDS: usize = DEC / 4;
const SCW: usize = 64 * 64;
const CRW: usize = 80 * 64;
const DW: usize = WORDS * 64;
const MW: usize = DW + 64;
const SLOT: usize = MW + 64;

/// Bytes from an activation block's start to its quants and its 16-sums.
const AQ: usize = 4;
const AB: usize = 4 + QK_K;

/// Whether the CPU has what this kernel uses.
pub(super) fn available() -> bool {
    super::super::available()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// Whether `gemm_q4_k` and `gemm_q6_k` take this kernel: the CPU has it
/// and neither `OXILLAMA_VNNI=0` nor `OXILLAMA_KGEMM512=0` keeps the older
/// ones (so that one build can time both; the bits are the same). Decided
/// once per process.
pub(super) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let off = |k: &str| std::env::var_os(k).is_some_and(|v| v == "0");
        available() && !off("OXILLAMA_VNNI") && !off("OXILLAMA_KGEMM512")
    })
}

/// Decodes super-block `i` of the sixteen rows `w` into `slot`, transposed
/// (see `SLOT`); `tmp` takes the sixteen decoded blocks first.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F are available; every row holds block
/// `i`; `tmp` holds `ROWS * DEC` bytes and `slot` `SLOT`.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn decode_group<F: KFormat>(w: &[*const u8; ROWS], i: usize, tmp: *mut u8, slot: *mut u8) {
    let mut d = [0f32; 2 * ROWS];
    for (r, w) in w.iter().enumerate() {
        // SAFETY: block i of row r, and row r's DEC bytes of tmp.
        unsafe {
            let b = w.add(i * F::W);
            F::decode(b, tmp.add(r * DEC));
            let s = F::scales(b);
            d[r] = _mm_cvtss_f32(s);
            d[ROWS + r] = _mm_cvtss_f32(_mm_movehdup_ps(s));
        }
    }
    for k in 0..DEC / 32 {
        // SAFETY: run k (32 bytes) of each decoded block is inside tmp.
        let v: [__m256i; ROWS] = std::array::from_fn(|r| unsafe {
            _mm256_loadu_si256(tmp.add(r * DEC + 32 * k) as *const __m256i)
        });
        for (j, t) in super::super::rows16_vnni::transpose(v).iter().enumerate() {
            let word = 8 * k + j;
            // The scale words hold the i16 scale in both halves (for the
            // AVX2 kernel's `madd`); `vpmulld` wants it as an i32.
            let t = if (SCW / 64..CRW / 64).contains(&word) {
                _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(*t))
            } else {
                *t
            };
            // SAFETY: word 8k + j of the slot.
            unsafe { _mm512_storeu_si512(slot.add(64 * word) as *mut __m512i, t) };
        }
    }
    // SAFETY: the d and dmin lanes of the slot.
    unsafe { std::ptr::copy_nonoverlapping(d.as_ptr() as *const u8, slot.add(DW), 128) };
}

/// `N` tokens (`a`: their Q8_K rows) against a decoded row group (`dec`:
/// `nb` slots); returns each token's sixteen row values.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 F/BW and VNNI are available; `dec` holds `nb`
/// slots and every `a[t]` `nb` Q8_K blocks.
// `t` indexes several arrays (tokens' sums, pointers) at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn pass<F: KFormat, const N: usize>(
    nb: usize,
    dec: *const u8,
    a: [*const u8; N],
) -> [__m512; N] {
    let mut acc = [_mm512_setzero_ps(); N];
    let ld = |p: *const u8| {
        // SAFETY: callers below pass 64 readable bytes of a slot.
        unsafe { _mm512_loadu_si512(p as *const __m512i) }
    };
    for i in 0..nb {
        let slot = dec.wrapping_add(i * SLOT);
        let ab: [*const u8; N] = std::array::from_fn(|t| a[t].wrapping_add(i * q8_k::BLOCK));
        // The block's integer: per scale group, the four-element dots of
        // the group (`vpdpbusd`, unsigned weights against signed
        // activations), then times the group's scale.
        let mut isum = [_mm512_setzero_si512(); N];
        for g in 0..64 / F::GROUP {
            let mut dot = [_mm512_setzero_si512(); N];
            for j in 0..F::GROUP {
                let jj = F::GROUP * g + j;
                let wv = ld(slot.wrapping_add(64 * jj));
                for t in 0..N {
                    // SAFETY: quants 4jj..4jj + 4 of token t's block i.
                    let av = _mm512_set1_epi32(unsafe { read_u32(ab[t].add(AQ + 4 * jj)) } as i32);
                    dot[t] = _mm512_dpbusd_epi32(dot[t], wv, av);
                }
            }
            let sc = ld(slot.wrapping_add(SCW + 64 * g));
            for t in 0..N {
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot[t], sc));
            }
        }
        // The correction: the 16-sums' pairs against the rows' words (Q4_K
        // the mins, Q6_K the scales of the -32 offset).
        let mut corr = [_mm512_setzero_si512(); N];
        for k in 0..8 {
            let cw = ld(slot.wrapping_add(CRW + 64 * k));
            for t in 0..N {
                // SAFETY: 16-sums 2k and 2k + 1 of token t's block i.
                let b = _mm512_set1_epi32(unsafe { read_u32(ab[t].add(AB + 4 * k)) } as i32);
                corr[t] = _mm512_dpwssd_epi32(corr[t], b, cw);
            }
        }
        // SAFETY: the slot's d and dmin lanes.
        let (dw, mw) = unsafe {
            (
                _mm512_loadu_ps(slot.add(DW) as *const f32),
                _mm512_loadu_ps(slot.add(MW) as *const f32),
            )
        };
        for t in 0..N {
            // SAFETY: token t's block-i scale.
            let da = _mm512_set1_ps(unsafe { read_f32(ab[t]) });
            let prod = _mm512_mul_ps(dw, da);
            // The scalar reference's block value, to the bit.
            let v = if F::MIN {
                _mm512_sub_ps(
                    _mm512_mul_ps(prod, _mm512_cvtepi32_ps(isum[t])),
                    _mm512_mul_ps(_mm512_mul_ps(mw, da), _mm512_cvtepi32_ps(corr[t])),
                )
            } else {
                let s = _mm512_sub_epi32(isum[t], _mm512_slli_epi32::<5>(corr[t]));
                _mm512_mul_ps(prod, _mm512_cvtepi32_ps(s))
            };
            acc[t] = _mm512_add_ps(acc[t], v);
        }
    }
    acc
}

/// Tokens `t0..t0 + N` against the decoded group of rows `r0..r0 + nr`;
/// writes `GemmFn`'s layout, `out[(g * rows + r) * 8 + c]` for token
/// `8g + c`.
///
/// # Safety
/// As `pass`; `acts[t0..t0 + N]` exist.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn tokens<F: KFormat, const N: usize>(
    nb: usize,
    dec: *const u8,
    acts: &[&[u8]],
    t0: usize,
    (r0, nr, rows): (usize, usize, usize),
    out: &mut [f32],
) {
    let a: [*const u8; N] = std::array::from_fn(|t| acts[t0 + t].as_ptr());
    // SAFETY: the caller's contract.
    let v = unsafe { pass::<F, N>(nb, dec, a) };
    for (t, v) in v.iter().enumerate() {
        let mut lanes = [0f32; ROWS];
        // SAFETY: sixteen floats.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *v) };
        let tok = t0 + t;
        let base = ((tok / C) * rows + r0) * C + tok % C;
        for (r, x) in lanes.iter().take(nr).enumerate() {
            out[base + r * C] = *x;
        }
    }
}

/// Every token of `acts` against every row of `w_rows`, in `GemmFn`'s
/// layout: rows sixteen at a time, each group decoded once for all the
/// tokens, which go by eight at a time (then four, two, one).
pub(super) fn gemm<F: KFormat>(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]) {
    assert!(available(), "AVX-512 K-quant GEMM without AVX-512 VNNI");
    let nb = n / QK_K;
    let (rows, nt) = (w_rows.len(), acts.len());
    assert!(
        w_rows.iter().all(|w| w.len() >= nb * F::W)
            && acts.iter().all(|a| a.len() >= nb * q8_k::BLOCK)
            && out.len() >= nt.div_ceil(C) * rows * C,
        "gemm operand too short"
    );
    // Columns past the last token of the last group are padding: zeros,
    // as the other kernels leave them.
    if nt % C != 0 {
        let g = nt / C;
        out[g * rows * C..(g + 1) * rows * C].fill(0.0);
    }
    // Rows past the last full group read a zero block (d = 0), and their
    // lanes are not written.
    let zero = vec![0u8; if rows % ROWS == 0 { 0 } else { nb * F::W }];
    let mut dec = vec![0u8; nb * SLOT];
    let mut tmp = vec![0u8; ROWS * DEC];
    for r0 in (0..rows).step_by(ROWS) {
        let nr = (rows - r0).min(ROWS);
        let w: [*const u8; ROWS] = std::array::from_fn(|r| {
            if r < nr {
                w_rows[r0 + r].as_ptr()
            } else {
                zero.as_ptr()
            }
        });
        for i in 0..nb {
            // SAFETY: features asserted above; every row (or the zero
            // row) holds nb blocks; tmp and slot i are in bounds.
            unsafe { decode_group::<F>(&w, i, tmp.as_mut_ptr(), dec.as_mut_ptr().add(i * SLOT)) };
        }
        let mut t = 0;
        let shape = (r0, nr, rows);
        let d = dec.as_ptr();
        // SAFETY (each call): features asserted above; `dec` holds nb
        // decoded slots, every activation row nb blocks (asserted), and
        // tokens t..t + N exist.
        while nt - t >= TOKENS {
            unsafe { tokens::<F, TOKENS>(nb, d, acts, t, shape, out) };
            t += TOKENS;
        }
        if nt - t >= 4 {
            unsafe { tokens::<F, 4>(nb, d, acts, t, shape, out) };
            t += 4;
        }
        if nt - t >= 2 {
            unsafe { tokens::<F, 2>(nb, d, acts, t, shape, out) };
            t += 2;
        }
        if nt - t >= 1 {
            unsafe { tokens::<F, 1>(nb, d, acts, t, shape, out) };
        }
    }
}
