//! Cross-format tests: SIMD kernels against their scalar twins, tiles
//! against single dots, dots against dequantize-then-multiply, and
//! activation quantization round trips.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::block::put_f16;
use super::*;

const WEIGHTS: [GgmlType; 25] = [
    T::F32,
    T::F16,
    T::BF16,
    T::Q4_0,
    T::Q4_1,
    T::Q5_0,
    T::Q5_1,
    T::Q8_0,
    T::Q2K,
    T::Q3K,
    T::Q4K,
    T::Q5K,
    T::Q6K,
    T::IQ4NL,
    T::MXFP4,
    T::IQ4XS,
    T::IQ3S,
    T::IQ3XXS,
    T::IQ2S,
    T::IQ2XS,
    T::IQ2XXS,
    T::IQ1M,
    T::IQ1S,
    T::TQ2_0,
    T::TQ1_0,
];

/// Byte offsets of the f16 fields in a block: random bytes there could be
/// NaN or infinite, so tests write finite scales.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 => &[0],
        T::Q4_1 | T::Q5_1 | T::Q4K | T::Q5K => &[0, 2],
        T::Q2K => &[80, 82],
        T::Q3K => &[108],
        T::Q6K => &[208],
        T::IQ4NL | T::IQ4XS | T::IQ3S | T::IQ3XXS => &[0],
        T::IQ2S | T::IQ2XS | T::IQ2XXS | T::IQ1S => &[0],
        T::TQ1_0 => &[52],
        T::TQ2_0 => &[64],
        _ => &[],
    }
}

/// A random valid row of `n` weights of type `ty`.
fn random_row(ty: GgmlType, n: usize, rng: &mut StdRng) -> Vec<u8> {
    let len = ty.row_bytes(n).unwrap();
    match ty {
        T::F32 | T::F16 | T::BF16 => {
            let mut out = Vec::with_capacity(len);
            for _ in 0..n {
                let v: f32 = rng.random_range(-1.0..1.0);
                match ty {
                    T::F32 => out.extend_from_slice(&v.to_le_bytes()),
                    T::F16 => {
                        out.extend_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes())
                    }
                    _ => out.extend_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes()),
                }
            }
            out
        }
        _ => {
            let mut out: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            for b in out.chunks_exact_mut(ty.type_size()) {
                for &off in f16_fields(ty) {
                    put_f16(b, off, rng.random_range(-0.5f32..0.5));
                }
                match ty {
                    // A power-of-two scale near one.
                    T::MXFP4 => b[0] = rng.random_range(118..136),
                    // The block's f16 scale lives in the scale words' top nibbles.
                    T::IQ1M => {
                        let d = half::f16::from_f32(rng.random_range(-0.5f32..0.5)).to_bits();
                        for i in 0..4 {
                            let w = u16::from_le_bytes([b[48 + 2 * i], b[49 + 2 * i]]);
                            let w = (w & 0x0fff) | (((d >> (4 * i)) & 0xf) << 12);
                            b[48 + 2 * i..50 + 2 * i].copy_from_slice(&w.to_le_bytes());
                        }
                    }
                    _ => {}
                }
            }
            out
        }
    }
}

fn random_f32(n: usize, scale: f32, rng: &mut StdRng) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

fn dequant(ty: GgmlType, b: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize_row(ty, b, &mut out).unwrap();
    out
}

fn quantize_act(k: &QuantKernels, x: &[f32]) -> Vec<u8> {
    let mut a = vec![0u8; k.act.row_bytes(x.len()).unwrap()];
    (k.quantize_act)(x, &mut a);
    a
}

/// The dequantized dot, the sum of |w_i a_i| (the scale for rounding
/// tolerances), and the slack Q8_1's separately rounded sum field allows.
fn magnitude(ty: GgmlType, act: GgmlType, w: &[u8], a: &[u8], n: usize) -> (f64, f64, f64) {
    let (wd, ad) = (dequant(ty, w, n), dequant(act, a, n));
    let exact: f64 = wd.iter().zip(&ad).map(|(p, q)| *p as f64 * *q as f64).sum();
    let mag: f64 = wd
        .iter()
        .zip(&ad)
        .map(|(p, q)| (*p as f64 * *q as f64).abs())
        .sum();
    let mut slack = 0.0;
    if act == T::Q8_1 {
        // The minimum meets s = f16(d * sum q), rounded apart from the
        // quants (as in ggml): allow its f16 error.
        for (bw, ba) in w.chunks_exact(ty.type_size()).zip(a.chunks_exact(36)) {
            slack += (block::f16_at(bw, 2) as f64 * block::f16_at(ba, 2) as f64).abs() * 1e-3;
        }
    }
    (exact, mag, slack)
}

/// Block counts with odd and even values, in elements for `ty`.
fn sizes(ty: GgmlType) -> Vec<usize> {
    let qk = match ty.block_size() {
        1 => 32,
        b => b,
    };
    let mut v: Vec<usize> = [1, 2, 3, 5, 7, 18].iter().map(|b| b * qk).collect();
    if ty.block_size() == 1 {
        v.extend([1, 7, 9, 33, 577]);
    }
    v
}

#[test]
fn every_weight_format_has_both_kernels() {
    for ty in WEIGHTS {
        let (s, k) = (scalar_kernels(ty).unwrap(), kernels(ty).unwrap());
        assert_eq!((s.weight, s.act), (ty, ty.vec_dot_type()));
        assert_eq!((k.weight, k.act), (ty, ty.vec_dot_type()));
    }
    assert!(kernels(T::Q8_1).is_none() && kernels(T::Q8K).is_none());
    for ty in GgmlType::ALL {
        assert!(dequantize_row(
            ty,
            &vec![0u8; ty.type_size()],
            &mut vec![0f32; ty.block_size()]
        )
        .is_ok());
    }
}

#[test]
fn simd_dots_equal_scalar_and_dequantized_reference() {
    let mut rng = StdRng::seed_from_u64(11);
    for ty in WEIGHTS {
        let (s, k) = (scalar_kernels(ty).unwrap(), kernels(ty).unwrap());
        for n in sizes(ty) {
            for _ in 0..4 {
                let w = random_row(ty, n, &mut rng);
                let x = random_f32(n, 3.0, &mut rng);
                let a = quantize_act(s, &x);
                let (exact, mag, slack) = magnitude(ty, s.act, &w, &a, n);
                let (slow, fast) = ((s.vec_dot)(n, &w, &a), (k.vec_dot)(n, &w, &a));
                let tol = 2e-6 * mag + 1e-6;
                if ty.vec_dot_type() == T::Q8K && !matches!(ty, T::Q2K | T::Q3K | T::Q5K) {
                    // These keep the reference's order: same bits.
                    assert_eq!(slow.to_bits(), fast.to_bits(), "{} n={n}", ty.name());
                }
                assert!(
                    (slow as f64 - fast as f64).abs() <= tol,
                    "{} n={n}: scalar {slow} simd {fast}",
                    ty.name()
                );
                assert!(
                    (slow as f64 - exact).abs() <= 1e-5 * mag + slack + 1e-6,
                    "{} n={n}: scalar {slow} reference {exact}",
                    ty.name()
                );
            }
        }
    }
}

#[test]
fn simd_activation_quantizers_are_bit_equal() {
    let mut rng = StdRng::seed_from_u64(12);
    for ty in WEIGHTS {
        let (s, k) = (scalar_kernels(ty).unwrap(), kernels(ty).unwrap());
        for n in sizes(ty) {
            let mut x = random_f32(n, 10.0, &mut rng);
            // Halfway cases, an all-zero block and a negative extreme.
            let step = x[0].abs() / 127.0;
            for (i, v) in x.iter_mut().enumerate().skip(1).step_by(5) {
                *v = (i as f32 % 40.0 - 20.0 + 0.5) * step;
            }
            let qk = ty.vec_dot_type().block_size();
            if n >= 2 * qk && qk > 1 {
                x[..qk].fill(0.0);
                x[qk + 3] = -50.0;
                x[qk + 7] = 50.0;
            }
            assert_eq!(
                quantize_act(s, &x),
                quantize_act(k, &x),
                "{} n={n}",
                ty.name()
            );
        }
    }
}

#[test]
fn tiles_equal_single_dots_for_odd_shapes() {
    let mut rng = StdRng::seed_from_u64(13);
    for ty in WEIGHTS {
        let (s, k) = (scalar_kernels(ty).unwrap(), kernels(ty).unwrap());
        let n = 3 * ty.block_size().max(32);
        for (rows, cols) in [
            (1, 1),
            (3, 2),
            (4, 1),
            (4, 3),
            (5, 5),
            (8, 4),
            (9, 7),
            (2, 6),
        ] {
            let ws: Vec<Vec<u8>> = (0..rows).map(|_| random_row(ty, n, &mut rng)).collect();
            let acts: Vec<Vec<u8>> = (0..cols)
                .map(|_| quantize_act(s, &random_f32(n, 2.0, &mut rng)))
                .collect();
            let wr: Vec<&[u8]> = ws.iter().map(|v| v.as_slice()).collect();
            let ar: Vec<&[u8]> = acts.iter().map(|v| v.as_slice()).collect();
            for kern in [s, k] {
                let mut out = vec![f32::NAN; rows * cols];
                (kern.vec_dot_tile)(n, &wr, &ar, &mut out);
                for r in 0..rows {
                    for c in 0..cols {
                        let want = (k.vec_dot)(n, wr[r], ar[c]);
                        let (_, mag, _) = magnitude(ty, s.act, wr[r], ar[c], n);
                        let got = out[r * cols + c];
                        assert!(
                            (got as f64 - want as f64).abs() <= 2e-6 * mag + 1e-6,
                            "{} {rows}x{cols} [{r},{c}]: {got} vs {want}",
                            ty.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn activation_round_trip_error_is_half_a_step() {
    let mut rng = StdRng::seed_from_u64(14);
    for act in [T::Q8_0, T::Q8_1, T::Q8K] {
        let k = dequantizer(act).unwrap();
        let qk = act.block_size();
        let x = random_f32(qk * 9, 4.0, &mut rng);
        let mut q = vec![0u8; act.row_bytes(x.len()).unwrap()];
        (k.quantize_act)(&x, &mut q);
        let y = dequant(act, &q, x.len());
        for (xb, yb) in x.chunks(qk).zip(y.chunks(qk)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            // Half a quantization step, plus the f16 rounding of the scale.
            let bound = amax / 127.0 * (0.5 + 127.0 * 1e-3) + 1e-6;
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= bound, "{}: {a} -> {b}", act.name());
            }
        }
    }
}

#[test]
fn q8_1_sum_field_is_scale_times_quant_sum() {
    let mut rng = StdRng::seed_from_u64(15);
    let x = random_f32(32 * 5, 1.0, &mut rng);
    let k = kernels(T::Q4_1).unwrap();
    let a = quantize_act(k, &x);
    for (b, xb) in a.chunks_exact(36).zip(x.chunks_exact(32)) {
        let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        let sum: i32 = b[4..].iter().map(|&q| q as i8 as i32).sum();
        assert_eq!(block::f16_at(b, 0), half::f16::from_f32(d).to_f32());
        assert_eq!(
            block::f16_at(b, 2),
            half::f16::from_f32(d * sum as f32).to_f32()
        );
    }
}

#[test]
fn q8_k_maps_the_signed_extreme_to_minus_127() {
    let mut x = vec![0.25f32; 256];
    x[17] = -2.0;
    x[99] = 2.0; // same magnitude later: the first one wins
    for k in [scalar_kernels(T::Q4K).unwrap(), kernels(T::Q4K).unwrap()] {
        let b = quantize_act(k, &x);
        assert_eq!(b[4 + 17] as i8, -127);
        assert_eq!(b[4 + 99] as i8, 127);
        assert_eq!(block::f32_at(&b, 0), 1.0 / (-127.0 / -2.0));
        let bsum0 = i16::from_le_bytes([b[260], b[261]]);
        assert_eq!(
            bsum0 as i32,
            (0..16).map(|i| b[4 + i] as i8 as i32).sum::<i32>()
        );
    }
}

#[test]
fn dequantize_row_checks_lengths() {
    let mut d = vec![0f32; 32];
    assert!(dequantize_row(T::Q4_1, &[0u8; 19], &mut d).is_err());
    assert!(dequantize_row(T::Q4_1, &[0u8; 20], &mut d).is_ok());
    assert!(dequantize_row(T::Q6K, &[0u8; 209], &mut [0f32; 256]).is_err());
    assert!(dequantize_row(T::Q6K, &[0u8; 210], &mut [0f32; 255]).is_err());
    assert!(dequantize_row(T::F16, &[0u8; 3], &mut [0f32; 2]).is_err());
}

#[test]
fn known_blocks_dequantize_to_known_values() {
    // Q4_1: d = 0.5, m = -1, nibbles j | (15 - j) << 4.
    let mut b = [0u8; 20];
    put_f16(&mut b, 0, 0.5);
    put_f16(&mut b, 2, -1.0);
    for j in 0..16 {
        b[4 + j] = j as u8 | ((15 - j as u8) << 4);
    }
    let y = dequant(T::Q4_1, &b, 32);
    for j in 0..16 {
        assert_eq!(y[j], 0.5 * j as f32 - 1.0);
        assert_eq!(y[j + 16], 0.5 * (15 - j) as f32 - 1.0);
    }
    // Q5_0: fifth bit set for even elements only.
    let mut b = [0u8; 22];
    put_f16(&mut b, 0, 2.0);
    b[2..6].copy_from_slice(&0x5555_5555u32.to_le_bytes());
    b[6..22].fill(0x31);
    let y = dequant(T::Q5_0, &b, 32);
    for (e, v) in y.iter().enumerate() {
        let low = if e < 16 { 1 } else { 3 };
        let high = if e % 2 == 0 { 16 } else { 0 };
        assert_eq!(*v, 2.0 * (low + high - 16) as f32, "element {e}");
    }
}

#[test]
fn gemm_microkernels_equal_single_dots() {
    let mut rng = StdRng::seed_from_u64(17);
    for ty in WEIGHTS {
        let (s, k) = (scalar_kernels(ty).unwrap(), kernels(ty).unwrap());
        let (Some(gs), Some(gk)) = (s.gemm, k.gemm) else {
            assert!(
                k.gemm.is_none(),
                "{} has a SIMD gemm but no scalar twin",
                ty.name()
            );
            continue;
        };
        // K-quant rows are whole 256-element super-blocks.
        let ns: &[usize] = if ty.block_size() == QK_K {
            &[256, 512, 2048]
        } else {
            &[32, 96, 576]
        };
        for &n in ns {
            let (qb, sb) = panel_sizes(s.act, n);
            for rows in [1, 3, 8] {
                let ws: Vec<Vec<u8>> = (0..rows).map(|_| random_row(ty, n, &mut rng)).collect();
                let acts: Vec<Vec<u8>> = (0..GEMM_COLS)
                    .map(|_| quantize_act(s, &random_f32(n, 2.0, &mut rng)))
                    .collect();
                let wr: Vec<&[u8]> = ws.iter().map(|v| v.as_slice()).collect();
                let ar: Vec<&[u8]> = acts.iter().map(|v| v.as_slice()).collect();
                let mut quants = vec![0xAAu8; qb];
                let mut scales = vec![f32::NAN; sb];
                pack_panel(s.act, &ar, n, &mut quants, &mut scales);
                for (gemm, table) in [(gs, s), (gk, k)] {
                    let mut out = vec![f32::NAN; rows * GEMM_COLS];
                    gemm(n, &wr, &ar, &quants, &scales, &mut out);
                    for r in 0..rows {
                        for c in 0..GEMM_COLS {
                            let want = (s.vec_dot)(n, wr[r], ar[c]);
                            let (_, mag, _) = magnitude(ty, s.act, wr[r], ar[c], n);
                            let got = out[r * GEMM_COLS + c];
                            assert!(
                                (got as f64 - want as f64).abs() <= 2e-6 * mag + 1e-6,
                                "{} n={n} rows={rows} [{r},{c}]: {got} vs {want}",
                                ty.name()
                            );
                            // Within one table, every path gives the same
                            // bits: prefill and decode logits agree exactly.
                            let single = (table.vec_dot)(n, wr[r], ar[c]);
                            assert_eq!(got.to_bits(), single.to_bits(), "{} [{r},{c}]", ty.name());
                            let mut t = vec![0f32; rows * 3];
                            let three: [&[u8]; 3] = [ar[c], ar[(c + 1) % 8], ar[c]];
                            (table.vec_dot_tile)(n, &wr, &three, &mut t);
                            assert_eq!(got.to_bits(), t[r * 3].to_bits(), "{} tile", ty.name());
                            assert_eq!(got.to_bits(), t[r * 3 + 2].to_bits(), "{} tile", ty.name());
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn gemm_short_column_groups_equal_single_dots() {
    // Fewer than eight columns: the panel's missing ones are zeros, and the
    // real ones still match their single dots bit for bit.
    let mut rng = StdRng::seed_from_u64(23);
    for ty in WEIGHTS {
        let Some(k) = kernels(ty).filter(|k| k.gemm.is_some()) else {
            continue;
        };
        let gemm = k.gemm.unwrap();
        let n = if ty.block_size() == QK_K { 512 } else { 160 };
        let rows = 5;
        let (qb, sb) = panel_sizes(k.act, n);
        let ws: Vec<Vec<u8>> = (0..rows).map(|_| random_row(ty, n, &mut rng)).collect();
        let wr: Vec<&[u8]> = ws.iter().map(|v| v.as_slice()).collect();
        for ncols in 1..GEMM_COLS {
            let acts: Vec<Vec<u8>> = (0..ncols)
                .map(|_| quantize_act(k, &random_f32(n, 3.0, &mut rng)))
                .collect();
            let ar: Vec<&[u8]> = acts.iter().map(|v| v.as_slice()).collect();
            let mut quants = vec![0x55u8; qb];
            let mut scales = vec![f32::NAN; sb];
            pack_panel(k.act, &ar, n, &mut quants, &mut scales);
            let mut out = vec![f32::NAN; rows * GEMM_COLS];
            gemm(n, &wr, &ar, &quants, &scales, &mut out);
            for r in 0..rows {
                for c in 0..GEMM_COLS {
                    let got = out[r * GEMM_COLS + c];
                    if c < ncols {
                        let want = (k.vec_dot)(n, wr[r], ar[c]);
                        assert_eq!(got.to_bits(), want.to_bits(), "{} {ncols} cols", ty.name());
                    } else {
                        assert_eq!(got, 0.0, "{} padding column {c}", ty.name());
                    }
                }
            }
        }
    }
}

#[test]
fn panel_interleaves_four_elements_per_column() {
    let mut rng = StdRng::seed_from_u64(29);
    let k = kernels(T::Q4_1).unwrap();
    // Three columns (the row-by-row path) and eight (the transposing one).
    for ncols in [3, GEMM_COLS] {
        let acts: Vec<Vec<u8>> = (0..ncols)
            .map(|_| quantize_act(k, &random_f32(64, 1.0, &mut rng)))
            .collect();
        let ar: Vec<&[u8]> = acts.iter().map(|v| v.as_slice()).collect();
        let (mut q, mut s) = (vec![7u8; 2 * PANEL_BLOCK], vec![f32::NAN; 2 * PANEL_SCALES]);
        pack_panel(T::Q8_1, &ar, 64, &mut q, &mut s);
        for i in 0..2 {
            for j in 0..8 {
                for c in 0..GEMM_COLS {
                    for e in 0..4 {
                        let got = q[i * PANEL_BLOCK + j * 32 + c * 4 + e];
                        let want = if c < ncols {
                            ar[c][i * 36 + 4 + 4 * j + e]
                        } else {
                            0
                        };
                        assert_eq!(got, want, "block {i} group {j} column {c}");
                    }
                }
                let c = j % ncols;
                assert_eq!(s[i * PANEL_SCALES + c], block::f16_at(&ar[c][i * 36..], 0));
                assert_eq!(
                    s[i * PANEL_SCALES + 8 + c],
                    block::f16_at(&ar[c][i * 36..], 2)
                );
            }
            if ncols < GEMM_COLS {
                assert_eq!(s[i * PANEL_SCALES + 5], 0.0);
            }
        }
    }
}

#[test]
fn q8_k_panel_interleaves_quants_and_group_sums() {
    let mut rng = StdRng::seed_from_u64(31);
    let k = kernels(T::Q4K).unwrap();
    let n = 2 * QK_K;
    for ncols in [5, GEMM_COLS] {
        let acts: Vec<Vec<u8>> = (0..ncols)
            .map(|_| quantize_act(k, &random_f32(n, 1.0, &mut rng)))
            .collect();
        let ar: Vec<&[u8]> = acts.iter().map(|v| v.as_slice()).collect();
        let (qb, sb) = panel_sizes(T::Q8K, n);
        assert_eq!((qb, sb), (2 * KPANEL_BLOCK, 2 * KPANEL_SCALES));
        let (mut q, mut s) = (vec![7u8; qb], vec![f32::NAN; sb]);
        pack_panel(T::Q8K, &ar, n, &mut q, &mut s);
        for i in 0..2 {
            // 64 groups of quants, then 8 words of group-sum pairs.
            for j in 0..72 {
                for c in 0..GEMM_COLS {
                    for e in 0..4 {
                        let got = q[i * KPANEL_BLOCK + j * 32 + c * 4 + e];
                        let want = if c < ncols {
                            ar[c][i * 292 + 4 + 4 * j + e]
                        } else {
                            0
                        };
                        assert_eq!(got, want, "block {i} group {j} column {c}");
                    }
                }
            }
            for c in 0..GEMM_COLS {
                let want = if c < ncols {
                    block::f32_at(&ar[c][i * 292..], 0)
                } else {
                    0.0
                };
                assert_eq!(s[i * KPANEL_SCALES + c], want);
            }
        }
    }
}

#[test]
fn k_gemm_extreme_values_equal_single_dots() {
    // Largest weight values and scales against activations of +-127: no
    // i16 pair sum of the K-quant GEMM may saturate.
    for ty in [T::Q4K, T::Q6K] {
        let k = kernels(ty).unwrap();
        let gemm = k.gemm.unwrap();
        let n = 2 * QK_K;
        let mut w = vec![0xFFu8; ty.row_bytes(n).unwrap()];
        for b in w.chunks_exact_mut(ty.type_size()) {
            for &off in f16_fields(ty) {
                put_f16(b, off, 0.25);
            }
            if ty == T::Q6K {
                b[192..208].fill(0x81); // scales -127
            }
        }
        let wr: Vec<&[u8]> = vec![&w; 3];
        for sign in [1.0f32, -1.0] {
            let acts: Vec<Vec<u8>> = (0..GEMM_COLS)
                .map(|c| {
                    let x: Vec<f32> = (0..n)
                        .map(|i| if (i + c) % 7 == 0 { -sign } else { sign })
                        .collect();
                    quantize_act(k, &x)
                })
                .collect();
            let ar: Vec<&[u8]> = acts.iter().map(|v| v.as_slice()).collect();
            let (qb, sb) = panel_sizes(k.act, n);
            let (mut q, mut s) = (vec![0u8; qb], vec![0f32; sb]);
            pack_panel(k.act, &ar, n, &mut q, &mut s);
            let mut out = vec![f32::NAN; 3 * GEMM_COLS];
            gemm(n, &wr, &ar, &q, &s, &mut out);
            for c in 0..GEMM_COLS {
                let want = (k.vec_dot)(n, wr[0], ar[c]);
                let slow = (scalar_kernels(ty).unwrap().vec_dot)(n, wr[0], ar[c]);
                assert_eq!(
                    want.to_bits(),
                    slow.to_bits(),
                    "{} {want} {slow}",
                    ty.name()
                );
                for r in 0..3 {
                    assert_eq!(
                        out[r * GEMM_COLS + c].to_bits(),
                        want.to_bits(),
                        "{}",
                        ty.name()
                    );
                }
            }
        }
    }
}

/// Random weight rows of the twin tests, with row `r` of each `(r, fill)`
/// (when there is one) at a storage extreme: every byte after the scales
/// set to `fill`.
#[cfg(target_arch = "x86_64")]
fn twin_rows(
    ty: GgmlType,
    n: usize,
    rows: usize,
    extremes: &[(usize, u8)],
    rng: &mut StdRng,
) -> Vec<Vec<u8>> {
    let mut ws: Vec<Vec<u8>> = (0..rows).map(|_| random_row(ty, n, rng)).collect();
    // MXFP4's scale is its first byte, an exponent.
    let first = match ty {
        T::MXFP4 => 1,
        _ => f16_fields(ty).iter().max().unwrap() + 2,
    };
    for &(r, fill) in extremes.iter().filter(|e| e.0 < rows) {
        for b in ws[r].chunks_exact_mut(ty.type_size()) {
            b[first..].fill(fill);
        }
    }
    ws
}

/// Activation rows of the twin tests: the first all +-1 (every quant at
/// +-127), the others random.
#[cfg(target_arch = "x86_64")]
fn twin_acts(k: &QuantKernels, n: usize, ncols: usize, rng: &mut StdRng) -> Vec<Vec<u8>> {
    (0..ncols)
        .map(|c| {
            let x: Vec<f32> = if c == 0 {
                (0..n)
                    .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
                    .collect()
            } else {
                random_f32(n, 2.0, rng)
            };
            quantize_act(k, &x)
        })
        .collect()
}

/// Every value of `a` and `b` has the same bits.
#[cfg(target_arch = "x86_64")]
fn assert_same_bits(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.to_bits(), y.to_bits(), "{what} at {i}: {x} vs {y}");
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn vnni_gemm_equals_avx2_gemm_bit_for_bit() {
    // The AVX-512 VNNI kernel is installed in place of the AVX2 one where
    // the CPU has it; both must give every (row, column) the same bits,
    // on random blocks and on the extremes (every weight at its most
    // negative and most positive storage value, activations at +-127).
    if !avx2::available() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(29);
    let mut ran = 0;
    for ty in [T::Q4_0, T::Q4_1, T::Q5_0, T::Q5_1, T::Q8_0] {
        let (plain, vnni) = avx2::block32_gemm_twins(ty).unwrap();
        let Some(vnni) = vnni else {
            eprintln!("no AVX-512 VNNI on this CPU: {} twin not run", ty.name());
            continue;
        };
        let k = kernels(ty).unwrap();
        for n in [32, 160, 576] {
            for rows in [1, 2, 3, 4, 5, 8, 11] {
                // Rows 0 and 1 at the extremes of the storage range.
                let ws = twin_rows(ty, n, rows, &[(0, 0x00), (1, 0xFF)], &mut rng);
                for ncols in [1, 3, GEMM_COLS] {
                    let acts = twin_acts(k, n, ncols, &mut rng);
                    let wr: Vec<&[u8]> = ws.iter().map(|v| v.as_slice()).collect();
                    let ar: Vec<&[u8]> = acts.iter().map(|v| v.as_slice()).collect();
                    let (qb, sb) = panel_sizes(k.act, n);
                    let (mut q, mut s) = (vec![0u8; qb], vec![0f32; sb]);
                    pack_panel(k.act, &ar, n, &mut q, &mut s);
                    let mut a = vec![f32::NAN; rows * GEMM_COLS];
                    let mut b = vec![f32::NAN; rows * GEMM_COLS];
                    plain(n, &wr, &ar, &q, &s, &mut a);
                    vnni(n, &wr, &ar, &q, &s, &mut b);
                    assert_same_bits(
                        &a,
                        &b,
                        &format!("{} n={n} rows={rows} cols={ncols}", ty.name()),
                    );
                    ran += 1;
                }
            }
        }
    }
    eprintln!("{ran} VNNI twin cases");
}

#[cfg(target_arch = "x86_64")]
#[test]
fn vnni_tile_equals_avx2_tile_bit_for_bit() {
    // The sixteen-rows-in-lanes tile replaces the AVX2 tile where the CPU
    // has AVX-512 VNNI: same bits for every (row, column), whole passes of
    // sixteen rows and a ragged tail, one to more than eight columns,
    // random blocks and the storage extremes.
    if !avx2::available() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(31);
    let mut ran = 0;
    for ty in [T::Q4_0, T::Q4_1, T::Q5_0, T::Q5_1, T::Q8_0] {
        let (plain, vnni) = avx2::block32_tile_twins(ty).unwrap();
        let Some(vnni) = vnni else {
            eprintln!("no AVX-512 VNNI on this CPU: {} twin not run", ty.name());
            continue;
        };
        let k = kernels(ty).unwrap();
        for n in [32, 96, 576] {
            for rows in [1, 15, 16, 17, 35, 48] {
                let extremes = [(0, 0x00), (1, 0xFF), (16, 0x00), (17, 0xFF)];
                let ws = twin_rows(ty, n, rows, &extremes, &mut rng);
                for ncols in [1, 2, 3, 8, 9] {
                    let acts = twin_acts(k, n, ncols, &mut rng);
                    let wr: Vec<&[u8]> = ws.iter().map(|v| v.as_slice()).collect();
                    let ar: Vec<&[u8]> = acts.iter().map(|v| v.as_slice()).collect();
                    let mut a = vec![f32::NAN; rows * ncols];
                    let mut b = vec![f32::NAN; rows * ncols];
                    plain(n, &wr, &ar, &mut a);
                    vnni(n, &wr, &ar, &mut b);
                    assert_same_bits(
                        &a,
                        &b,
                        &format!("{} n={n} rows={rows} cols={ncols}", ty.name()),
                    );
                    ran += 1;
                }
            }
        }
    }
    eprintln!("{ran} VNNI tile twin cases");
}

#[cfg(target_arch = "x86_64")]
#[test]
fn kquant_gemms_equal_scalar_reference_bit_for_bit() {
    // Every K-quant path (the scalar reference, the AVX2 decode, tile and
    // GEMM, the AVX-512 VNNI GEMM) gives every (row, column) the same
    // bits: the logits of a token do not depend on the path nor on the
    // CPU. Row counts cross the sixteen-row groups; column counts cross
    // the eight-token passes and their tails; rows 0 and 1 sit at the
    // storage extremes and column 0 at +-127.
    if !avx2::available() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(31);
    for ty in [T::Q4K, T::Q6K] {
        let (plain, wide) = avx2::kquant_gemm_twins(ty).unwrap();
        if wide.is_none() {
            eprintln!(
                "no AVX-512 VNNI on this CPU: {} wide kernel not run",
                ty.name()
            );
        }
        let (s, k) = (scalar_kernels(ty).unwrap(), kernels(ty).unwrap());
        for n in [QK_K, 3 * QK_K] {
            for rows in [1, 5, 16, 17, 37] {
                let ws = twin_rows(ty, n, rows, &[(0, 0x00), (1, 0xFF)], &mut rng);
                for ncols in [1, 2, 7, 8, 15, 21] {
                    let acts = twin_acts(k, n, ncols, &mut rng);
                    let wr: Vec<&[u8]> = ws.iter().map(|v| v.as_slice()).collect();
                    let ar: Vec<&[u8]> = acts.iter().map(|v| v.as_slice()).collect();
                    let groups = ncols.div_ceil(GEMM_COLS);
                    let (qb, sb) = panel_sizes(k.act, n);
                    let (mut q, mut sc) = (vec![0u8; groups * qb], vec![0f32; groups * sb]);
                    for (g, grp) in ar.chunks(GEMM_COLS).enumerate() {
                        let (qg, sg) =
                            (&mut q[g * qb..(g + 1) * qb], &mut sc[g * sb..(g + 1) * sb]);
                        pack_panel(k.act, grp, n, qg, sg);
                    }
                    // The reference, in GemmFn's layout.
                    let mut want = vec![0f32; groups * rows * GEMM_COLS];
                    for (c, a) in ar.iter().enumerate() {
                        for (r, w) in wr.iter().enumerate() {
                            let o = ((c / GEMM_COLS) * rows + r) * GEMM_COLS + c % GEMM_COLS;
                            want[o] = (s.vec_dot)(n, w, a);
                        }
                    }
                    let mut tile = vec![f32::NAN; rows * ncols];
                    (k.vec_dot_tile)(n, &wr, &ar, &mut tile);
                    for (c, a) in ar.iter().enumerate() {
                        for r in 0..rows {
                            let o = ((c / GEMM_COLS) * rows + r) * GEMM_COLS + c % GEMM_COLS;
                            let what = format!("{} n={n} row {r} col {c}", ty.name());
                            assert_eq!(
                                tile[r * ncols + c].to_bits(),
                                want[o].to_bits(),
                                "tile {what}"
                            );
                            let one = (k.vec_dot)(n, wr[r], a);
                            assert_eq!(one.to_bits(), want[o].to_bits(), "dot {what}");
                        }
                    }
                    for (name, gemm) in [("avx2", Some(plain)), ("avx512", wide)] {
                        let Some(gemm) = gemm else { continue };
                        let mut out = vec![f32::NAN; groups * rows * GEMM_COLS];
                        gemm(n, &wr, &ar, &q, &sc, &mut out);
                        let what = format!("{} {name} n={n} rows={rows} cols={ncols}", ty.name());
                        assert_same_bits(&out, &want, &what);
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn packed_rows_equal_the_file_layouts_bits() {
    // The decode layouts (sixteen rows interleaved) give every (row,
    // token) the bits of the file layout's kernels, for every token count
    // a decode step or a small batch uses, from the first group or a
    // later one: Q4_K's are the scalar reference's on every path; the
    // 32-element formats' SIMD paths fuse the block's multiply-add (the
    // row tile's bits).
    let formats = [(T::Q4K, QK_K), (T::Q6K, QK_K), (T::Q8_0, 32), (T::Q4_0, 32)];
    for (ty, block_elems) in formats
        .into_iter()
        .chain([(T::Q4_1, 32), (T::Q5_0, 32), (T::Q5_1, 32)])
        .chain([
            (T::IQ4NL, 32),
            (T::MXFP4, 32),
            (T::IQ4XS, QK_K),
            (T::TQ2_0, QK_K),
        ])
        .chain([
            (T::IQ3S, QK_K),
            (T::IQ3XXS, QK_K),
            (T::IQ2S, QK_K),
            (T::IQ2XS, QK_K),
        ])
        .chain([(T::IQ2XXS, QK_K)])
    {
        if !crate::quant::packs(ty) {
            eprintln!(
                "{} is not repacked on this CPU: packed kernel not run",
                ty.name()
            );
            continue;
        }
        let mut rng = StdRng::seed_from_u64(37);
        let (rows, n) = (48, 3 * block_elems);
        let (s, k) = (scalar_kernels(ty).unwrap(), kernels(ty).unwrap());
        let ws = twin_rows(ty, n, rows, &[(0, 0x00), (17, 0xFF)], &mut rng);
        let data: Vec<u8> = ws.concat();
        let packed = crate::quant::pack_matrix(ty, rows, n, &data).expect("packs");
        if matches!(ty, T::Q8_0 | T::Q6K) {
            assert_eq!(
                packed.len(),
                data.len(),
                "{}'s layout takes the file's bytes",
                ty.name()
            );
        }
        for ntok in 1..=crate::quant::PACKED_TOKENS {
            let acts = twin_acts(k, n, ntok, &mut rng);
            let ar: Vec<&[u8]> = acts.iter().map(|v| v.as_slice()).collect();
            for (g0, g1) in [(0, 3), (1, 3), (2, 3)] {
                let mut bufs = vec![vec![f32::NAN; (g1 - g0) * 16]; ntok];
                let mut outs: Vec<&mut [f32]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
                let mut side = Vec::new();
                crate::quant::packed_side(ty, n, &ar, &mut side);
                crate::quant::packed_tile(ty, n, &packed, (g0, g1), &ar, &side, &mut outs);
                let wr: Vec<&[u8]> = ws.iter().map(|v| v.as_slice()).collect();
                let mut tiled = vec![f32::NAN; rows * ntok];
                (k.vec_dot_tile)(n, &wr, &ar, &mut tiled);
                for (t, out) in bufs.iter().enumerate() {
                    for (i, v) in out.iter().enumerate() {
                        let r = g0 * 16 + i;
                        // Every Q8_K format's paths give the scalar bits.
                        let want = if k.act == T::Q8K {
                            (s.vec_dot)(n, &ws[r], ar[t])
                        } else {
                            tiled[r * ntok + t]
                        };
                        assert_eq!(
                            v.to_bits(),
                            want.to_bits(),
                            "{} row {r} token {t} of {ntok}",
                            ty.name()
                        );
                    }
                }
            }
        }
        // Rows that are not whole groups are not packed.
        let rb = ty.row_bytes(n).unwrap();
        assert!(crate::quant::pack_matrix(ty, 40, n, &data[..40 * rb]).is_none());
    }
}
