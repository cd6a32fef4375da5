//! Quantized tensor formats: dequantization, activation quantization into
//! each format's integer partner, and dot products, with a scalar reference
//! and SIMD paths chosen once at run time.
//!
//! Contract for every format `T` (see `QuantKernels`):
//! - `dequantize(src, dst)`: `src.len() == T.row_bytes(dst.len())`.
//! - `quantize_act(src, dst)`: writes `src` in `T.vec_dot_type()` format;
//!   `dst.len() == T.vec_dot_type().row_bytes(src.len())`.
//! - `vec_dot(n, w, a)`: dot of `n` weights of type `T` with `n` activations
//!   already quantized by `quantize_act`.
//! - `vec_dot_tile(n, w_rows, acts, out)`: `out[r * acts.len() + c]` is the
//!   dot of weight row `r` with activation row `c`.
//!
//! Callers check lengths.

mod block;
mod float;
mod kquant_scales;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;
mod q8_1;
mod q8_k;
pub mod types;

#[cfg(target_arch = "x86_64")]
mod avx2;

use std::sync::OnceLock;

pub use types::{GgmlType, QK_K};

use crate::{Error, Result};

pub type DotFn = fn(n: usize, w: &[u8], a: &[u8]) -> f32;
pub type TileFn = fn(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]);

/// The function table for one weight format.
#[derive(Clone, Copy)]
pub struct QuantKernels {
    pub weight: GgmlType,
    pub act: GgmlType,
    pub dequantize: fn(src: &[u8], dst: &mut [f32]),
    pub quantize_act: fn(src: &[f32], dst: &mut [u8]),
    pub vec_dot: DotFn,
    pub vec_dot_tile: TileFn,
}

macro_rules! tile_of {
    ($dot:path) => {{
        fn tile(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]) {
            let nc = acts.len();
            for (r, w) in w_rows.iter().enumerate() {
                for (c, a) in acts.iter().enumerate() {
                    out[r * nc + c] = $dot(n, w, a);
                }
            }
        }
        tile as TileFn
    }};
}

macro_rules! table_tiled {
    ($w:expr, $act:expr, $deq:path, $qa:path, $dot:path, $tile:expr) => {
        QuantKernels {
            weight: $w,
            act: $act,
            dequantize: $deq,
            quantize_act: $qa,
            vec_dot: $dot,
            vec_dot_tile: $tile,
        }
    };
}

macro_rules! table {
    ($w:expr, $act:expr, $deq:path, $qa:path, $dot:path) => {
        table_tiled!($w, $act, $deq, $qa, $dot, tile_of!($dot))
    };
}

/// Dot product by dequantizing one block of each side at a time: exact in
/// f32 and format-agnostic; used where no integer kernel exists yet.
macro_rules! dequant_dot {
    ($name:ident, $qk:expr, $wb:expr, $ab:expr, $dw:path, $da:path) => {
        fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let mut x = [0f32; $qk];
            let mut y = [0f32; $qk];
            let mut sum = 0f32;
            for (bw, ba) in w.chunks_exact($wb).zip(a.chunks_exact($ab)).take(n / $qk) {
                $dw(bw, &mut x);
                $da(ba, &mut y);
                sum += x.iter().zip(&y).map(|(p, q)| p * q).sum::<f32>();
            }
            sum
        }
    };
}

dequant_dot!(
    dot_q4_0,
    32,
    q4_0::BLOCK,
    q8_0::BLOCK,
    q4_0::dequantize,
    q8_0::dequantize
);
dequant_dot!(
    dot_q5_0,
    32,
    q5_0::BLOCK,
    q8_0::BLOCK,
    q5_0::dequantize,
    q8_0::dequantize
);
dequant_dot!(
    dot_q5_1,
    32,
    q5_1::BLOCK,
    q8_1::BLOCK,
    q5_1::dequantize,
    q8_1::dequantize
);
dequant_dot!(
    dot_q2_k,
    256,
    q2_k::BLOCK,
    q8_k::BLOCK,
    q2_k::dequantize,
    q8_k::dequantize
);
dequant_dot!(
    dot_q3_k,
    256,
    q3_k::BLOCK,
    q8_k::BLOCK,
    q3_k::dequantize,
    q8_k::dequantize
);
dequant_dot!(
    dot_q4_k,
    256,
    q4_k::BLOCK,
    q8_k::BLOCK,
    q4_k::dequantize,
    q8_k::dequantize
);
dequant_dot!(
    dot_q5_k,
    256,
    q5_k::BLOCK,
    q8_k::BLOCK,
    q5_k::dequantize,
    q8_k::dequantize
);
dequant_dot!(
    dot_q6_k,
    256,
    q6_k::BLOCK,
    q8_k::BLOCK,
    q6_k::dequantize,
    q8_k::dequantize
);

fn no_quantize(_: &[f32], _: &mut [u8]) {}
fn no_dot(_: usize, _: &[u8], _: &[u8]) -> f32 {
    0.0
}

static SCALAR: [QuantKernels; 13] = [
    table!(
        GgmlType::F32,
        GgmlType::F32,
        float::dequantize_f32,
        float::quantize_act_f32,
        float::vec_dot_f32
    ),
    table!(
        GgmlType::F16,
        GgmlType::F32,
        float::dequantize_f16,
        float::quantize_act_f32,
        float::vec_dot_f16
    ),
    table!(
        GgmlType::BF16,
        GgmlType::F32,
        float::dequantize_bf16,
        float::quantize_act_f32,
        float::vec_dot_bf16
    ),
    table!(
        GgmlType::Q8_0,
        GgmlType::Q8_0,
        q8_0::dequantize,
        q8_0::quantize,
        q8_0::vec_dot
    ),
    table!(
        GgmlType::Q4_1,
        GgmlType::Q8_1,
        q4_1::dequantize,
        q8_1::quantize,
        q4_1::vec_dot
    ),
    table!(
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        q4_0::dequantize,
        q8_0::quantize,
        dot_q4_0
    ),
    table!(
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        q5_0::dequantize,
        q8_0::quantize,
        dot_q5_0
    ),
    table!(
        GgmlType::Q5_1,
        GgmlType::Q8_1,
        q5_1::dequantize,
        q8_1::quantize,
        dot_q5_1
    ),
    table!(
        GgmlType::Q2K,
        GgmlType::Q8K,
        q2_k::dequantize,
        q8_k::quantize,
        dot_q2_k
    ),
    table!(
        GgmlType::Q3K,
        GgmlType::Q8K,
        q3_k::dequantize,
        q8_k::quantize,
        dot_q3_k
    ),
    table!(
        GgmlType::Q4K,
        GgmlType::Q8K,
        q4_k::dequantize,
        q8_k::quantize,
        dot_q4_k
    ),
    table!(
        GgmlType::Q5K,
        GgmlType::Q8K,
        q5_k::dequantize,
        q8_k::quantize,
        dot_q5_k
    ),
    table!(
        GgmlType::Q6K,
        GgmlType::Q8K,
        q6_k::dequantize,
        q8_k::quantize,
        dot_q6_k
    ),
];

/// Formats that can be dequantized but not multiplied as weights.
static DEQUANT_ONLY: [QuantKernels; 2] = [
    table!(
        GgmlType::Q8_1,
        GgmlType::Q8_1,
        q8_1::dequantize,
        no_quantize,
        no_dot
    ),
    table!(
        GgmlType::Q8K,
        GgmlType::Q8K,
        q8_k::dequantize,
        no_quantize,
        no_dot
    ),
];

/// Only the formats with a SIMD kernel; `kernels` falls back to `SCALAR`.
#[cfg(target_arch = "x86_64")]
static AVX2: [QuantKernels; 4] = [
    table!(
        GgmlType::F32,
        GgmlType::F32,
        float::dequantize_f32,
        float::quantize_act_f32,
        avx2::vec_dot_f32
    ),
    table!(
        GgmlType::F16,
        GgmlType::F32,
        float::dequantize_f16,
        float::quantize_act_f32,
        avx2::vec_dot_f16
    ),
    table_tiled!(
        GgmlType::Q8_0,
        GgmlType::Q8_0,
        q8_0::dequantize,
        q8_0::quantize,
        avx2::vec_dot_q8_0,
        avx2::tile_q8_0
    ),
    table_tiled!(
        GgmlType::Q4_1,
        GgmlType::Q8_1,
        q4_1::dequantize,
        q8_1::quantize,
        avx2::vec_dot_q4_1,
        avx2::tile_q4_1
    ),
];

/// Name of the SIMD level the dispatcher picked.
pub fn simd_level() -> &'static str {
    static LEVEL: OnceLock<&'static str> = OnceLock::new();
    LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            return "avx2";
        }
        "scalar"
    })
}

/// The portable reference implementation for `ty`.
pub fn scalar_kernels(ty: GgmlType) -> Option<&'static QuantKernels> {
    SCALAR.iter().find(|k| k.weight == ty)
}

/// The fastest implementation of `ty` on this CPU (decided once).
pub fn kernels(ty: GgmlType) -> Option<&'static QuantKernels> {
    #[cfg(target_arch = "x86_64")]
    if simd_level() == "avx2" {
        if let Some(k) = AVX2.iter().find(|k| k.weight == ty) {
            return Some(k);
        }
    }
    scalar_kernels(ty)
}

/// Dequantizes one row, checking lengths (never panics on bad input).
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let k = SCALAR
        .iter()
        .chain(DEQUANT_ONLY.iter())
        .find(|k| k.weight == ty)
        .ok_or_else(|| Error::invalid(format!("no dequantization kernel for {}", ty.name())))?;
    match ty.row_bytes(dst.len()) {
        Some(n) if n == src.len() => {
            (k.dequantize)(src, dst);
            Ok(())
        }
        _ => Err(Error::invalid(format!(
            "{} row of {} elements needs {:?} bytes, got {}",
            ty.name(),
            dst.len(),
            ty.row_bytes(dst.len()),
            src.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Every SIMD kernel against its scalar twin, on sizes with odd block counts.
    #[test]
    fn best_matches_scalar() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for k in SCALAR.iter().filter(|k| ENCODABLE.contains(&k.weight)) {
            let fast = kernels(k.weight).unwrap();
            for blocks in [1usize, 3, 18, 48] {
                let n = blocks * 32;
                let w_f: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                let x: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect();
                let w = quantize_weights(k.weight, &w_f);
                let mut a = vec![0u8; k.act.row_bytes(n).unwrap()];
                (k.quantize_act)(&x, &mut a);
                let (s, f) = ((k.vec_dot)(n, &w, &a), (fast.vec_dot)(n, &w, &a));
                assert!(
                    (s - f).abs() <= 1e-4 * (1.0 + s.abs()),
                    "{}: {s} vs {f}",
                    k.weight.name()
                );
                // And both agree with dequantize-then-dot.
                let mut wd = vec![0f32; n];
                let mut ad = vec![0f32; n];
                dequantize_row(k.weight, &w, &mut wd).unwrap();
                let act_k = SCALAR
                    .iter()
                    .chain(DEQUANT_ONLY.iter())
                    .find(|q| q.weight == k.act)
                    .unwrap();
                (act_k.dequantize)(&a, &mut ad);
                let r: f32 = wd.iter().zip(&ad).map(|(p, q)| p * q).sum();
                assert!(
                    (s - r).abs() <= 1e-2 * (1.0 + r.abs()),
                    "{}: {s} vs {r}",
                    k.weight.name()
                );
            }
        }
    }

    const ENCODABLE: [GgmlType; 5] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_1,
    ];

    /// Test-only weight encoders for the formats above.
    fn quantize_weights(ty: GgmlType, x: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; ty.row_bytes(x.len()).unwrap()];
        match ty {
            GgmlType::F32 => float::quantize_act_f32(x, &mut out),
            GgmlType::F16 => {
                for (o, v) in out.chunks_exact_mut(2).zip(x) {
                    o.copy_from_slice(&half::f16::from_f32(*v).to_bits().to_le_bytes());
                }
            }
            GgmlType::BF16 => {
                for (o, v) in out.chunks_exact_mut(2).zip(x) {
                    o.copy_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes());
                }
            }
            GgmlType::Q8_0 => q8_0::quantize(x, &mut out),
            GgmlType::Q4_1 => {
                for (xb, b) in x.chunks_exact(32).zip(out.chunks_exact_mut(20)) {
                    let mn = xb.iter().cloned().fold(f32::INFINITY, f32::min);
                    let mx = xb.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                    let d = (mx - mn) / 15.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    block::put_f16(b, 0, d);
                    block::put_f16(b, 2, mn);
                    for j in 0..16 {
                        let lo = (((xb[j] - mn) * id + 0.5) as u8).min(15);
                        let hi = (((xb[j + 16] - mn) * id + 0.5) as u8).min(15);
                        b[4 + j] = lo | (hi << 4);
                    }
                }
            }
            _ => unreachable!(),
        }
        out
    }

    #[test]
    fn tiles_equal_single_dots_for_odd_shapes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F32] {
            let (k, s) = (kernels(ty).unwrap(), scalar_kernels(ty).unwrap());
            let n = 96;
            for (rows, cols) in [(1, 1), (3, 2), (4, 1), (4, 3), (2, 4)] {
                let ws: Vec<Vec<u8>> = (0..rows)
                    .map(|_| {
                        let x: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                        quantize_weights(ty, &x)
                    })
                    .collect();
                let acts: Vec<Vec<u8>> = (0..cols)
                    .map(|_| {
                        let x: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                        let mut a = vec![0u8; k.act.row_bytes(n).unwrap()];
                        (k.quantize_act)(&x, &mut a);
                        a
                    })
                    .collect();
                let wr: Vec<&[u8]> = ws.iter().map(|v| v.as_slice()).collect();
                let ar: Vec<&[u8]> = acts.iter().map(|v| v.as_slice()).collect();
                let mut out = vec![0f32; rows * cols];
                (k.vec_dot_tile)(n, &wr, &ar, &mut out);
                for r in 0..rows {
                    for c in 0..cols {
                        let want = (s.vec_dot)(n, wr[r], ar[c]);
                        assert!((out[r * cols + c] - want).abs() <= 1e-4 * (1.0 + want.abs()));
                    }
                }
            }
        }
    }

    #[test]
    fn dequantize_row_checks_lengths() {
        let mut d = vec![0f32; 32];
        assert!(dequantize_row(GgmlType::Q4_1, &[0u8; 19], &mut d).is_err());
        assert!(dequantize_row(GgmlType::Q4_1, &[0u8; 20], &mut d).is_ok());
        assert!(dequantize_row(GgmlType::Q6K, &[0u8; 209], &mut [0f32; 256]).is_err());
    }
}
