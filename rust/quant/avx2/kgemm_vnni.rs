//! The VNNI twin of the K-quant GEMM microkernel (`kgemm.rs`), chosen at
//! run time when the CPU has AVX-VNNI.
//!
//! Same decoded rows, same panel, same lanes: per group of four elements,
//! `maddubs` forms the i16 pair sums as before, and `vpdpwssd` multiplies
//! them by the group's scale and adds them to the lane sum in one
//! instruction where the AVX2 kernel needs `madd` and `add`.
//!
//! Each weight row is decoded once per call for all its panels (the AVX2
//! kernel takes one panel at a time and decodes every row again for each),
//! with its `d` (and `dmin`) beside the decoded bytes, so the inner loops
//! touch nothing of the raw weights. A per-thread cache of the decoded
//! rows across calls (checked byte for byte) was tried before the calls
//! took several panels: its compare cost 8% of the time.
//!
//! Bits: every lane sum is the same integer as in `kgemm.rs` (integer
//! additions are exact whatever their order, and `vpdpwssd` wraps like
//! `add`, never saturates), and the float part (the `fma` per lane and
//! block, the mins, `hsum`'s order) is written exactly as there, so every
//! (row, column) equals the AVX2 GEMM and the decode kernel bit for bit.
//! The tests below check it on random and extreme blocks.
//!
//! Measured and dropped (one row chunk of Gemma-3-270M, 40 rows against the 64 panels of pp512):
//! - `vpdpbusd` (the exact four-product dot in one i32): the group's scale
//!   still needs a second multiply after it, so it saves no instruction
//!   and was 1-4% slower;
//! - two groups' dots packed in the halves of one i32 so that one
//!   `vpdpwssd` scales both (Q4_K's dots fit with a bias): the shuffle
//!   that packs them (and the blend that avoids a borrow between the
//!   halves) cost more than the multiply it saved (about 13% slower);
//! - 512-bit vectors (two lanes per register, `vpermd` to pair the weight
//!   words): no faster on this Xeon (its 512-bit integer multiplies seem
//!   to issue on one port only);
//! - the EVEX (AVX512-VL) encoding: with 32 registers the compiler hoists
//!   the `maddubs`es and spills them, and Q6_K ran 50% slower; hence the
//!   VEX form of AVX-VNNI, with the AVX2 kernel's 16 registers;
//! - two rows per panel load: their 16 lane sums spill (0-10% slower).

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::super::{load, read_u32};
use super::{KFormat, BSUMS, C, CORR, DEC, SCALES};
use crate::quant::panel::{KPANEL_BLOCK, KPANEL_SCALES};
use crate::quant::QK_K;

/// Bytes per decoded block: kgemm's `DEC`, then `F::scales` (16 bytes),
/// then padding to keep slots 32-byte multiples.
const SLOT: usize = DEC + 32;

/// Whether the CPU has what this kernel uses: the VEX-encoded VNNI
/// instructions, besides the AVX2 kernel's features (for the decode).
fn vnni_available() -> bool {
    is_x86_feature_detected!("avxvnni")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Whether `gemm_q4_k` and `gemm_q6_k` take this kernel: the CPU has it
/// and `OXILLAMA_VNNI=0` does not keep the AVX2 kernels (so that one build
/// can time both in a real prefill). Decided once per process.
pub(super) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        vnni_available() && std::env::var_os("OXILLAMA_VNNI").is_none_or(|v| v != "0")
    })
}

/// `kgemm::rows` with the VNNI group step, on `N` rows already decoded
/// (`dec`: `SLOT` bytes per block, row after row); one row measured best.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-VNNI are available; `dec` holds `N` rows of `nb`
/// decoded blocks, `panel` `nb * KPANEL_BLOCK` bytes, `scales`
/// `nb * KPANEL_SCALES` floats and `out` `N * 8` floats.
// `l` and `r` index several arrays (lanes, rows) at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn kernel_n<F: KFormat, const N: usize>(
    nb: usize,
    dec: *const u8,
    panel: *const u8,
    scales: *const f32,
    out: *mut f32,
) {
    let mut acc = [[_mm256_setzero_ps(); 8]; N];
    let mut mins = [_mm256_setzero_ps(); N];
    for i in 0..nb {
        let pb = panel.wrapping_add(i * KPANEL_BLOCK);
        let db: [*const u8; N] = std::array::from_fn(|r| dec.wrapping_add((r * nb + i) * SLOT));
        // SAFETY: block i's eight scales are in `scales`.
        let da = unsafe { _mm256_loadu_ps(scales.add(i * KPANEL_SCALES)) };
        // SAFETY: the scales stored after block i's decoded bytes.
        let dm: [__m128; N] =
            std::array::from_fn(|r| unsafe { _mm_loadu_ps(db[r].add(DEC) as *const f32) });
        let prod: [__m256; N] =
            std::array::from_fn(|r| _mm256_mul_ps(_mm256_broadcastss_ps(dm[r]), da));
        let mut s = [[_mm256_setzero_si256(); 8]; N];
        for p in 0..8 {
            for l in 0..8 {
                let jj = 8 * p + l;
                // SAFETY: group jj of super-block i is inside the panel.
                let a = unsafe { load(pb.add(jj * 32)) };
                for r in 0..N {
                    // SAFETY: bytes 4jj..4jj + 4 of row r's decoded
                    // block i and the scale word of their group.
                    let (wj, sw) = unsafe {
                        (
                            read_u32(db[r].add(4 * jj)),
                            read_u32(db[r].add(SCALES + 4 * (jj / F::GROUP))),
                        )
                    };
                    // No saturation: a pair sum is at most 2 * 63 * 128.
                    let q = _mm256_maddubs_epi16(_mm256_set1_epi32(wj as i32), a);
                    s[r][l] = _mm256_dpwssd_avx_epi32(s[r][l], q, _mm256_set1_epi32(sw as i32));
                }
            }
        }
        for l in 0..8 {
            for r in 0..N {
                if !F::MIN {
                    // SAFETY: group-sum pair l of the panel's super-block
                    // and correction word l of row r's decoded block i.
                    let (b, cw) = unsafe {
                        (
                            load(pb.add(BSUMS + 32 * l)),
                            read_u32(db[r].add(CORR + 4 * l)),
                        )
                    };
                    let off = _mm256_madd_epi16(b, _mm256_set1_epi32(cw as i32));
                    s[r][l] = _mm256_sub_epi32(s[r][l], _mm256_slli_epi32(off, 5));
                }
                acc[r][l] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r][l]), prod[r], acc[r][l]);
            }
        }
        if F::MIN {
            for r in 0..N {
                let mut corr = _mm256_setzero_si256();
                for k in 0..8 {
                    // SAFETY: group-sum pair k of the panel's super-block and
                    // correction word k of row r's decoded block i.
                    let (b, cw) = unsafe {
                        (
                            load(pb.add(BSUMS + 32 * k)),
                            read_u32(db[r].add(CORR + 4 * k)),
                        )
                    };
                    corr = _mm256_dpwssd_avx_epi32(corr, b, _mm256_set1_epi32(cw as i32));
                }
                let m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm[r]));
                let mprod = _mm256_mul_ps(m, da);
                mins[r] = _mm256_add_ps(mins[r], _mm256_mul_ps(mprod, _mm256_cvtepi32_ps(corr)));
            }
        }
    }
    for r in 0..N {
        // `hsum`'s order, as in `kgemm::rows`.
        let a = &acc[r];
        let u: [__m256; 4] = std::array::from_fn(|k| _mm256_add_ps(a[k], a[k + 4]));
        let v = _mm256_add_ps(_mm256_add_ps(u[0], u[2]), _mm256_add_ps(u[1], u[3]));
        let v = if F::MIN { _mm256_sub_ps(v, mins[r]) } else { v };
        // SAFETY: out holds 8 floats per row.
        unsafe { _mm256_storeu_ps(out.add(r * C), v) };
    }
}

/// Decodes `w.len()` rows of `nb` blocks into `dec`, row after row: each
/// block's `DEC` bytes, then its `d` (and `dmin`) as the four floats of
/// `F::scales`, so that the kernel reads nothing else of the weights.
///
/// # Safety
/// AVX2, FMA and F16C are available; every row holds `nb` blocks and `dec`
/// `w.len() * nb * SLOT` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_rows<F: KFormat>(nb: usize, w: &[&[u8]], dec: *mut u8) {
    for (r, w) in w.iter().enumerate() {
        for i in 0..nb {
            // SAFETY: block i of row r and its slot in `dec` are in bounds
            // (caller's contract).
            unsafe {
                let (b, d) = (w.as_ptr().add(i * F::W), dec.add((r * nb + i) * SLOT));
                F::decode(b, d);
                _mm_storeu_ps(d.add(DEC) as *mut f32, F::scales(b));
            }
        }
    }
}

/// Decoded bytes one batch of rows may take: they stay in L2 next to the
/// panels of the call (`matmul_multi` hands 128 KiB of panels at a time)
/// while every panel meets them.
const DECODED_BYTES: usize = 256 * 1024;

/// `rows` decoded rows (`dec`, `SLOT` bytes per block, row after row)
/// against the panel.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-VNNI are available; `dec` holds `rows` decoded
/// rows of `nb` blocks, `panel` and `scales` `nb` blocks of a panel, `out`
/// `rows * 8` floats.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn run<F: KFormat>(
    nb: usize,
    rows: usize,
    dec: *const u8,
    panel: &[u8],
    scales: &[f32],
    out: &mut [f32],
) {
    let (p, s) = (panel.as_ptr(), scales.as_ptr());
    for r in 0..rows {
        // SAFETY: the caller's contract, for row r.
        unsafe { kernel_n::<F, 1>(nb, dec.add(r * nb * SLOT), p, s, out[r * C..].as_mut_ptr()) };
    }
}

/// `groups` panels (back to back in `quants` and `scales`) against the
/// rows, `out[(g * w_rows.len() + r) * 8 + c]`: `kgemm::gemm` for each
/// panel, with each row decoded once for all of them. Rows go in batches
/// of `DECODED_BYTES`, decoded, then met by every panel in turn, whose
/// 2.3 KiB per super-block stay in L1 while the batch goes by.
pub(super) fn gemm_groups<F: KFormat>(
    n: usize,
    w_rows: &[&[u8]],
    groups: usize,
    quants: &[u8],
    scales: &[f32],
    out: &mut [f32],
) {
    assert!(vnni_available(), "VNNI kernel without AVX-VNNI");
    let nb = n / QK_K;
    let nr = w_rows.len();
    let (qb, sb) = (nb * KPANEL_BLOCK, nb * KPANEL_SCALES);
    assert!(
        w_rows.iter().all(|w| w.len() >= nb * F::W)
            && quants.len() >= groups * qb
            && scales.len() >= groups * sb
            && out.len() >= groups * nr * C,
        "gemm operand too short"
    );
    let batch = (DECODED_BYTES / (nb * SLOT).max(1)).clamp(1, nr.max(1));
    let mut dec = vec![0u8; batch * nb * SLOT];
    for r0 in (0..nr).step_by(batch) {
        let rows = &w_rows[r0..(r0 + batch).min(nr)];
        // SAFETY: features asserted above; every row holds nb blocks
        // (asserted) and `dec` `batch` decoded rows.
        unsafe { decode_rows::<F>(nb, rows, dec.as_mut_ptr()) };
        for g in 0..groups {
            let o = (g * nr + r0) * C;
            // SAFETY: features asserted above; `dec` holds these rows
            // decoded, panel g is in bounds (asserted), and so are the
            // outputs of these rows for it.
            unsafe {
                run::<F>(
                    nb,
                    rows.len(),
                    dec.as_ptr(),
                    &quants[g * qb..],
                    &scales[g * sb..],
                    &mut out[o..o + rows.len() * C],
                )
            };
        }
    }
}

#[cfg(test)]
mod tests {
    //! Twins of the AVX2 GEMM tests (`quant/tests.rs`): the VNNI kernel
    //! against the AVX2 kernel and the decode kernel, bit for bit. They run
    //! only on a CPU with the VNNI instructions.

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::super::{Q4K, Q6K};
    use super::*;
    use crate::quant::{kernels, pack_panel, panel_sizes, GgmlType, GEMM_COLS};

    /// Random blocks with finite f16 scales (random bytes elsewhere), or,
    /// with `extreme`, every value and scale at its largest magnitude.
    fn weights(ty: GgmlType, rows: usize, n: usize, extreme: bool, rng: &mut StdRng) -> Vec<u8> {
        let bs = ty.type_size();
        let mut w = vec![0u8; rows * ty.row_bytes(n).unwrap()];
        for b in w.chunks_exact_mut(bs) {
            if extreme {
                b.fill(0xff);
                if ty == GgmlType::Q6K {
                    b[192..208].fill(0x80 | rng.random_range(0..2)); // -128 or -127
                }
            } else {
                rng.fill(&mut b[..]);
            }
            // d (and dmin) with exponents that keep the products finite.
            let f16_at = if ty == GgmlType::Q6K {
                &[208][..]
            } else {
                &[0, 2][..]
            };
            for &o in f16_at {
                let v: f32 = rng.random_range(0.001..0.05);
                let h = half_bits(v);
                b[o..o + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
        w
    }

    /// f16 bits of a small positive normal f32 (truncating the mantissa).
    fn half_bits(v: f32) -> u16 {
        let b = v.to_bits();
        let e = ((b >> 23) & 0xff) as i32 - 127 + 15;
        (((e as u32) << 10) | ((b >> 13) & 0x3ff)) as u16
    }

    /// `cols` Q8_K activation rows: random quants in -127..=127 (or all
    /// -127/127 with `extreme`), consistent group sums, a random `d`.
    fn acts(n: usize, cols: usize, extreme: bool, rng: &mut StdRng) -> Vec<Vec<u8>> {
        let k = kernels(GgmlType::Q4K).unwrap();
        (0..cols)
            .map(|c| {
                let x: Vec<f32> = (0..n)
                    .map(|i| {
                        if !extreme {
                            rng.random_range(-1.0f32..1.0)
                        } else if (i + c) % 5 == 0 {
                            -1.0
                        } else {
                            1.0
                        }
                    })
                    .collect();
                let mut dst = vec![0u8; k.act.row_bytes(n).unwrap()];
                (k.quantize_act)(&x, &mut dst);
                dst
            })
            .collect()
    }

    /// The panels of `ar` (groups of eight, the last one short), back to
    /// back.
    fn panels(n: usize, ar: &[&[u8]]) -> (Vec<u8>, Vec<f32>, usize, usize) {
        let (qb, sb) = panel_sizes(GgmlType::Q8K, n);
        let groups = ar.len().div_ceil(GEMM_COLS);
        let (mut q, mut s) = (vec![0u8; groups * qb], vec![0f32; groups * sb]);
        for (g, cols) in ar.chunks(GEMM_COLS).enumerate() {
            let (qg, sg) = (&mut q[g * qb..(g + 1) * qb], &mut s[g * sb..(g + 1) * sb]);
            pack_panel(GgmlType::Q8K, cols, n, qg, sg);
        }
        (q, s, qb, sb)
    }

    /// The AVX2 GEMM, one panel at a time (as `k_groups` runs it).
    fn avx2_groups(ty: GgmlType, n: usize, wr: &[&[u8]], ar: &[&[u8]], out: &mut [f32]) {
        let (q, s, qb, sb) = panels(n, ar);
        let o = wr.len() * C;
        for g in 0..ar.len().div_ceil(GEMM_COLS) {
            let (qg, sg, og) = (&q[g * qb..], &s[g * sb..], &mut out[g * o..(g + 1) * o]);
            match ty {
                GgmlType::Q4K => super::super::gemm::<Q4K>(n, wr, qg, sg, og),
                _ => super::super::gemm::<Q6K>(n, wr, qg, sg, og),
            }
        }
    }

    fn vnni_groups(ty: GgmlType, n: usize, wr: &[&[u8]], ar: &[&[u8]], out: &mut [f32]) {
        let (q, s, _, _) = panels(n, ar);
        let groups = ar.len().div_ceil(GEMM_COLS);
        match ty {
            GgmlType::Q4K => gemm_groups::<Q4K>(n, wr, groups, &q, &s, out),
            _ => gemm_groups::<Q6K>(n, wr, groups, &q, &s, out),
        }
    }

    /// `rows` random rows against `cols` random columns: the VNNI kernel
    /// (all panels in one call) against the AVX2 kernel and the decode
    /// kernel, bit for bit.
    fn check(ty: GgmlType, rows: usize, n: usize, cols: usize, extreme: bool, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let w = weights(ty, rows, n, extreme, &mut rng);
        let wr: Vec<&[u8]> = w.chunks_exact(ty.row_bytes(n).unwrap()).collect();
        let a = acts(n, cols, extreme, &mut rng);
        let ar: Vec<&[u8]> = a.iter().map(|v| v.as_slice()).collect();
        let k = kernels(ty).unwrap();
        let len = cols.div_ceil(GEMM_COLS) * rows * C;
        let (mut o_avx2, mut o_vnni) = (vec![0f32; len], vec![1f32; len]);
        avx2_groups(ty, n, &wr, &ar, &mut o_avx2);
        vnni_groups(ty, n, &wr, &ar, &mut o_vnni);
        for (t, a) in ar.iter().enumerate() {
            let (g, c) = (t / GEMM_COLS, t % GEMM_COLS);
            for (r, w) in wr.iter().enumerate() {
                let i = (g * rows + r) * C + c;
                let dot = (k.vec_dot)(n, w, a);
                let (x, y) = (o_vnni[i], o_avx2[i]);
                assert!(x.is_finite(), "{} not finite", ty.name());
                assert_eq!(x.to_bits(), y.to_bits(), "{} row {r} token {t}", ty.name());
                assert_eq!(
                    x.to_bits(),
                    dot.to_bits(),
                    "{} row {r} token {t}",
                    ty.name()
                );
            }
        }
    }

    #[test]
    fn vnni_k_gemm_equals_avx2_gemm_and_decode_bit_for_bit() {
        if !vnni_available() {
            return;
        }
        for ty in [GgmlType::Q4K, GgmlType::Q6K] {
            // Odd row counts, a short last panel, one and several panels.
            for (seed, (rows, n, cols)) in [(1, 256, 8), (3, 512, 19), (4, 2048, 8), (5, 768, 5)]
                .into_iter()
                .enumerate()
            {
                check(ty, rows, n, cols, false, seed as u64);
            }
        }
    }

    #[test]
    fn vnni_k_gemm_extreme_values_equal_avx2_gemm() {
        if !vnni_available() {
            return;
        }
        for ty in [GgmlType::Q4K, GgmlType::Q6K] {
            for seed in 0..4 {
                check(ty, 3, 2 * QK_K, 16, true, 100 + seed);
            }
        }
    }

    #[test]
    fn vnni_k_gemm_rows_in_several_batches_equal_avx2_gemm() {
        if !vnni_available() {
            return;
        }
        let n = 2048;
        let rows = DECODED_BYTES / (n / QK_K * SLOT) + 3;
        check(GgmlType::Q6K, rows, n, 11, false, 21);
    }
}
