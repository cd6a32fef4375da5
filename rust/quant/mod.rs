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
//! Callers check lengths; kernels may `debug_assert!` them.

pub mod types;

pub use types::{GgmlType, QK_K};

/// The function table for one weight format.
#[derive(Clone, Copy)]
pub struct QuantKernels {
    pub weight: GgmlType,
    pub act: GgmlType,
    pub dequantize: fn(src: &[u8], dst: &mut [f32]),
    pub quantize_act: fn(src: &[f32], dst: &mut [u8]),
    pub vec_dot: fn(n: usize, w: &[u8], a: &[u8]) -> f32,
}
