//! Model architectures and the per-session state they run on.

pub mod kv_cache;
