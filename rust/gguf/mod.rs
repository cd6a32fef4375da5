//! GGUF v2/v3 reading. Every offset, count and size taken from the file is
//! checked against the bytes actually present before it is used, so a
//! truncated or hostile file yields `Error::Load`, never a panic.

mod arena;
mod cursor;
mod file;
// O_TMPFILE, /proc/self/fd and the boot id: Linux only; elsewhere every
// process keeps its own arena.
#[cfg(target_os = "linux")]
mod shared_arena;
#[cfg(not(target_os = "linux"))]
#[path = "shared_arena_none.rs"]
mod shared_arena;
mod source;
mod value;

pub use arena::{Held, SharedPlace, WeightArena};
pub use file::{GgufFile, TensorInfo};
pub use source::{page_size, Paging, Source};
pub use value::{Array, Value};

/// `GGUF` read as a little-endian u32.
pub const MAGIC: u32 = 0x4655_4747;
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: usize = 4;
