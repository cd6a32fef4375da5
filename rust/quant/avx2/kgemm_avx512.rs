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

/// Bytes of L2 a GEMM call's working set aims at: half for a tile of
/// decoded row groups, half for a tile of activation rows.
///
/// Why: rows outer and every token inner streamed all the activation rows
/// once per group of sixteen rows (1.2 MB for 512 tokens of width 2048,
/// 4.8 MB at 8192), more than a core's L2, so each group read them from
/// L3 again. Tiles of both that fit L2 together (1 MB on Zen 4 and
/// Cascade Lake, 2 MB on Sapphire Rapids) read each activation tile from
/// L3 once per tile of groups instead.
const L2_WORKING_SET: usize = 512 << 10;

/// Every token of `acts` against every row of `w_rows`, in `GemmFn`'s
/// layout: rows sixteen at a time, each group decoded once for all the
/// tokens; groups and tokens in tiles that fit L2 together (see
/// `L2_WORKING_SET`), tokens by eight within a tile (then four, two, one).
/// The order changes no bits: each (row, token) value is one `pass`.
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
    if nb == 0 || rows == 0 || nt == 0 {
        return;
    }
    // Rows past the last full group read a zero block (d = 0), and their
    // lanes are not written.
    let zero = vec![0u8; if rows % ROWS == 0 { 0 } else { nb * F::W }];
    let mut tmp = vec![0u8; ROWS * DEC];
    let build = |g: usize, slots: &mut [u8]| {
        let r0 = g * ROWS;
        let nr = (rows - r0).min(ROWS);
        let w: [*const u8; ROWS] = std::array::from_fn(|r| {
            if r < nr {
                w_rows[r0 + r].as_ptr()
            } else {
                zero.as_ptr()
            }
        });
        for i in 0..nb {
            // SAFETY: features asserted above; every row (or the zero row)
            // holds nb blocks; tmp and slot i of `slots` are in bounds.
            unsafe { decode_group::<F>(&w, i, tmp.as_mut_ptr(), slots.as_mut_ptr().add(i * SLOT)) };
        }
    };
    // SAFETY: features asserted above; the operands were checked.
    unsafe { tiled::<F>(nb, rows, acts, out, build) }
}

/// The loop every GEMM here shares: row groups and tokens in tiles that fit
/// L2 together (`L2_WORKING_SET`), each tile of groups built once by
/// `build(g, slots)` (group `g`'s `nb` slots into `slots`), tokens by eight
/// within a tile (then four, two, one), into `GemmFn`'s layout for `rows`
/// rows (the last group may be partial: `rows` bounds its lanes).
///
/// # Safety
/// `F`'s CPU features (AVX-512 VNNI) are present; every activation row
/// holds `nb` Q8_K blocks and `out` the layout's floats (the callers
/// check both); `build` fills each slot it is given.
unsafe fn tiled<F: KFormat>(
    nb: usize,
    rows: usize,
    acts: &[&[u8]],
    out: &mut [f32],
    mut build: impl FnMut(usize, &mut [u8]),
) {
    let nt = acts.len();
    let group_bytes = nb * SLOT;
    let n_groups = rows.div_ceil(ROWS);
    let tile_groups = (L2_WORKING_SET / 2 / group_bytes).clamp(1, n_groups);
    let tile_tokens =
        (L2_WORKING_SET / 2 / (nb * q8_k::BLOCK) / TOKENS * TOKENS).clamp(TOKENS, nt.max(TOKENS));
    let mut dec = vec![0u8; tile_groups * group_bytes];
    for g0 in (0..n_groups).step_by(tile_groups) {
        let g1 = (g0 + tile_groups).min(n_groups);
        for g in g0..g1 {
            let at = (g - g0) * group_bytes;
            build(g, &mut dec[at..at + group_bytes]);
        }
        for t0 in (0..nt).step_by(tile_tokens) {
            let t1 = (t0 + tile_tokens).min(nt);
            for g in g0..g1 {
                let r0 = g * ROWS;
                let shape = (r0, (rows - r0).min(ROWS), rows);
                let d = dec[(g - g0) * group_bytes..].as_ptr();
                let mut t = t0;
                // SAFETY (each call): the caller's features; `d` holds
                // group g's nb built slots, every activation row nb blocks,
                // and tokens t..t + N (< t1 <= nt) exist.
                while t1 - t >= TOKENS {
                    unsafe { tokens::<F, TOKENS>(nb, d, acts, t, shape, out) };
                    t += TOKENS;
                }
                if t1 - t >= 4 {
                    unsafe { tokens::<F, 4>(nb, d, acts, t, shape, out) };
                    t += 4;
                }
                if t1 - t >= 2 {
                    unsafe { tokens::<F, 2>(nb, d, acts, t, shape, out) };
                    t += 2;
                }
                if t1 - t >= 1 {
                    unsafe { tokens::<F, 1>(nb, d, acts, t, shape, out) };
                }
            }
        }
    }
}

/// A 4-bit-code packed layout (sixteen rows interleaved, `grid_packed`'s
/// and `iq4xs_packed`'s): its codebook plus 128, the power of two on `d`,
/// where its i8 scales and f16 `d`s start, whether a scale covers 32
/// elements (IQ4_XS) or 16, and its bytes per block.
pub(crate) struct Nibbles {
    pub(crate) table: [u8; 16],
    pub(crate) factor: f32,
    pub(crate) sc: usize,
    pub(crate) d: usize,
    pub(crate) per32: bool,
    pub(crate) block: usize,
}

/// The slot of super-block `blk` of a packed group (`Nibbles`), built
/// without decoding or transposing: its words already hold four code bytes
/// of each of the sixteen rows, so each becomes two value words by one
/// `vpshufb` of the codebook plus 128 (low nibbles: elements
/// `32 ib + 4l ..`, slot word `8 ib + l`; high ones: `32 ib + 16 + 4l ..`,
/// word `8 ib + 4 + l`). Scales go per sixteen, as Q6_K's (a 32-element
/// scale twice); the correction words carry 4x each scale for the offset
/// of 128, and `d` the format's power of two. The integers and floats of
/// `decode_group` over the same rows' file blocks, so the same bits.
///
/// # Safety
/// AVX2, F16C and AVX-512 F/BW are available; `blk` holds `lay.block`
/// bytes and `slot` `SLOT`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
unsafe fn nibble_slot(blk: *const u8, lay: &Nibbles, table: __m512i, slot: *mut u8) {
    let m4 = _mm512_set1_epi8(0x0f);
    // SAFETY (the block): every offset below lies inside the packed block
    // or the slot (the caller's contract).
    unsafe {
        for ib in 0..8 {
            for l in 0..4 {
                let q = _mm512_loadu_si512(blk.add(64 * (4 * ib + l)) as *const __m512i);
                let lo = _mm512_shuffle_epi8(table, _mm512_and_si512(q, m4));
                let hi =
                    _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4));
                _mm512_storeu_si512(slot.add(64 * (8 * ib + l)) as *mut __m512i, lo);
                _mm512_storeu_si512(slot.add(64 * (8 * ib + 4 + l)) as *mut __m512i, hi);
            }
        }
        let at = |g: usize| lay.sc + 16 * if lay.per32 { g / 2 } else { g };
        let scale =
            |g: usize| _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(at(g)) as *const __m128i));
        for g in 0..16 {
            _mm512_storeu_si512(slot.add(SCW + 64 * g) as *mut __m512i, scale(g));
        }
        let low = _mm512_set1_epi32(0xffff);
        for k in 0..8 {
            let (a, b) = (scale(2 * k), scale(2 * k + 1));
            let w = _mm512_or_si512(
                _mm512_and_si512(_mm512_slli_epi32::<2>(a), low),
                _mm512_slli_epi32::<18>(b),
            );
            _mm512_storeu_si512(slot.add(CRW + 64 * k) as *mut __m512i, w);
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(lay.d) as *const __m256i));
        _mm512_storeu_ps(
            slot.add(DW) as *mut f32,
            _mm512_mul_ps(d, _mm512_set1_ps(lay.factor)),
        );
        _mm512_storeu_ps(slot.add(MW) as *mut f32, _mm512_setzero_ps());
    }
}

/// Row groups `g0..g1` of a packed 4-bit-code matrix (`Nibbles`) against
/// every token of `acts`, in `GemmFn`'s layout for the `16 * (g1 - g0)`
/// rows: `gemm`'s loop, with each group's slots built from the packed copy
/// (`nibble_slot`) instead of decoded from the file's blocks. Same bits as
/// `gemm` over those rows.
pub(super) fn gemm_nibbles(
    lay: &Nibbles,
    n: usize,
    packed: &[u8],
    (g0, g1): (usize, usize),
    acts: &[&[u8]],
    out: &mut [f32],
) {
    // The slot of a sixteen-scale format without mins: Q6_K's shape.
    type Shape = super::Q6K;
    assert!(available(), "AVX-512 K-quant GEMM without AVX-512 VNNI");
    let nb = n / QK_K;
    let (rows, nt) = ((g1 - g0) * ROWS, acts.len());
    assert!(
        packed.len() >= g1 * nb * lay.block
            && acts.iter().all(|a| a.len() >= nb * q8_k::BLOCK)
            && out.len() >= nt.div_ceil(C) * rows * C,
        "gemm operand too short"
    );
    if nt % C != 0 {
        let g = nt / C;
        out[g * rows * C..(g + 1) * rows * C].fill(0.0);
    }
    if nb == 0 || rows == 0 || nt == 0 {
        return;
    }
    // SAFETY: AVX-512 F was asserted above; sixteen bytes.
    let table =
        unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(lay.table.as_ptr() as *const __m128i)) };
    let build = |g: usize, slots: &mut [u8]| {
        let src = &packed[(g0 + g) * nb * lay.block..];
        for i in 0..nb {
            // SAFETY: features asserted above; packed block i of group
            // g0 + g and slot i of `slots`.
            unsafe {
                nibble_slot(
                    src.as_ptr().add(i * lay.block),
                    lay,
                    table,
                    slots.as_mut_ptr().add(i * SLOT),
                )
            };
        }
    };
    // SAFETY: features asserted above; the operands were checked.
    unsafe { tiled::<Shape>(nb, rows, acts, out, build) }
}
