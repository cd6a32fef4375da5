//! LoRA adapters in llama.cpp's GGUF format: loading and checking them
//! against a base model (`adapter.rs`, `targets.rs`), and adding their
//! low-rank deltas after the base matrix products (`apply.rs`). The base
//! weights are never changed: an adapter is a small side table keyed by
//! the base tensor it modifies, active per session.

pub mod adapter;
pub mod apply;
pub mod kernels;
pub mod targets;

pub use adapter::{ActiveLora, LoraAdapter};
pub use apply::{apply, apply_embedding, apply_ranges};
