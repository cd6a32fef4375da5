//! The element type of KV cache memory.

use crate::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    F16,
    F32,
}

impl KvDtype {
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::F32 => "f32",
        }
    }
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "f16" => Ok(KvDtype::F16),
            "f32" => Ok(KvDtype::F32),
            _ => Err(Error::invalid(format!(
                "kv_dtype must be \"f16\" or \"f32\", got {s:?}"
            ))),
        }
    }
    pub fn size(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
        }
    }
}
