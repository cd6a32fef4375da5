//! One error type for the whole core. The Python layer maps each variant to
//! exactly one exception class in `python/errors.rs`.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The model file is unreadable, truncated, corrupt or unsupported.
    Load(String),
    /// A generation request cannot be served (context overflow, bad token id).
    Generate(String),
    /// A caller passed a value outside its domain.
    InvalidArgument(String),
    /// The shared KV pool has no free page left (the scheduler preempts).
    KvFull(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Load(m) | Error::Generate(m) | Error::InvalidArgument(m) | Error::KvFull(m) => {
                f.write_str(m)
            }
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    pub fn load(msg: impl Into<String>) -> Self {
        Error::Load(msg.into())
    }
    pub fn generate(msg: impl Into<String>) -> Self {
        Error::Generate(msg.into())
    }
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
    pub fn kv_full(msg: impl Into<String>) -> Self {
        Error::KvFull(msg.into())
    }
}
