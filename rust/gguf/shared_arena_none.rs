//! Where `shared_arena` is not built (off Linux): no arena is shared, and
//! every process keeps its own, as `OXILLAMA_SHARE_WEIGHTS=0` does on Linux.

use std::fs::File;
use std::path::{Path, PathBuf};

pub fn arena_dir() -> Option<PathBuf> {
    None
}

pub fn arena_name(_model: &File, _layout: &[(usize, usize, u8)]) -> Option<String> {
    None
}

/// Never made here.
pub enum SharedMap {}

impl SharedMap {
    pub fn bytes(&self) -> &[u8] {
        match *self {}
    }
}

pub fn open(_dir: &Path, _name: &str, _len: usize) -> Option<SharedMap> {
    None
}

/// What became of a private arena handed to `publish`.
pub enum Published {
    Shared(SharedMap),
    Kept,
    Lost,
}

pub fn publish(_dir: &Path, _name: &str, _bytes: &mut [u8]) -> Published {
    Published::Kept
}
