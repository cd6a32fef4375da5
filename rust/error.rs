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
    /// A bug in oxillama: a Rust panic, caught at the Python boundary.
    Internal(String),
    /// A LoRA adapter is unreadable or does not fit its base model.
    Lora(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Load(m)
            | Error::Generate(m)
            | Error::InvalidArgument(m)
            | Error::KvFull(m)
            | Error::Internal(m)
            | Error::Lora(m) => f.write_str(m),
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
    pub fn lora(msg: impl Into<String>) -> Self {
        Error::Lora(msg.into())
    }
    pub fn internal(msg: impl Into<String>) -> Self {
        Error::Internal(msg.into())
    }

    /// The error for a caught panic, naming what the panic said.
    pub fn from_panic(payload: &(dyn std::any::Any + Send)) -> Self {
        Error::Internal(format!(
            "internal error in oxillama's Rust core ({}); this is a bug in oxillama: please report it",
            panic_text(payload)
        ))
    }
}

/// A panic's message (`panic!` with a literal or a format string).
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}
