//! Model architectures and the per-session state they run on.

pub mod arch;
pub mod blocks;
pub mod config;
pub mod embed;
pub mod family;
pub mod forward;
pub mod kv_cache;
pub mod kv_dtype;
pub mod kv_pool;
pub mod pager;
pub mod pass;
pub mod recurrent;
pub mod session;
pub mod weights;

pub use config::ModelConfig;
pub use forward::Model;
pub use kv_cache::{KvCache, KvDtype};
pub use session::Session;
