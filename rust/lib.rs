//! oxillama's Rust core: GGUF loading, quantized kernels, the forward pass,
//! the KV cache and the sampler. Everything here is plain Rust; the PyO3
//! wrappers live in `python/` and compile only with the `python` feature.

pub mod checksum;
mod env_switch;
pub mod error;
pub mod gguf;
pub mod grammar;
pub mod hash;
pub mod hashed_write;
pub mod lora;
pub mod model;
pub mod ops;
pub mod quant;
pub mod sampler;
mod simd;
pub mod threadpool;
pub mod vocab;

#[cfg(feature = "python")]
mod python;

pub use error::{Error, Result};
