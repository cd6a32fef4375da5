//! Model architectures and the per-session state they run on.

pub mod config;
pub mod kv_cache;
pub mod kv_dtype;
pub mod kv_pool;
pub mod llama;
pub mod session;
pub mod weights;

pub use config::ModelConfig;
pub use kv_cache::{KvCache, KvDtype};
pub use llama::Model;
pub use session::Session;
