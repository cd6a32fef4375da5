//! The single place where core errors become Python exceptions. The classes
//! are declared once, in `oxillama/errors.py`, so Python code can subclass
//! and catch them without importing the extension.
//!
//! Rust panics are errors too: every entry point that runs core code goes
//! through `guard` (or `Poison::run` for objects a panic could leave half
//! updated), so a panic, on the calling thread or re-raised from a pool
//! worker, reaches Python as `InternalError` rather than as pyo3's
//! `PanicException`, a `BaseException` that `except Exception` misses.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use pyo3::prelude::*;

use crate::Error;

fn raise(py: Python<'_>, class: &str, msg: String) -> PyErr {
    match py.import("oxillama.errors").and_then(|m| m.getattr(class)) {
        Ok(cls) => PyErr::from_type(cls.cast_into().expect("errors.py classes are types"), msg),
        Err(e) => e,
    }
}

pub fn to_py(err: Error) -> PyErr {
    Python::attach(|py| match err {
        Error::Load(m) => raise(py, "LoadError", m),
        Error::Generate(m) => raise(py, "GenerateError", m),
        Error::InvalidArgument(m) => raise(py, "ParameterError", m),
        Error::KvFull(m) => raise(py, "KvCacheFullError", m),
        Error::Internal(m) => raise(py, "InternalError", m),
        Error::Lora(m) => raise(py, "LoraError", m),
    })
}

pub trait IntoPyResult<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for crate::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// Runs an entry point's body; a panic in it becomes `InternalError`.
pub fn guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    // AssertUnwindSafe: whatever `f` was changing when it panicked is either
    // immutable afterwards (loaded files, models, programs) or behind a
    // `Poison` that refuses every later use.
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(to_py(Error::from_panic(&*p))))
}

/// Marks a mutable native object (a session, a matcher, a sampler) that a
/// panic interrupted: its state may be half updated, so every later call
/// fails with `InternalError` instead of computing from it.
#[derive(Default)]
pub struct Poison(OnceLock<String>);

impl Poison {
    /// `f` under `guard`, refused once an earlier call panicked.
    pub fn run<T>(&self, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
        self.check()?;
        catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
            let err = Error::from_panic(&*p);
            let _ = self.0.set(err.to_string());
            Err(to_py(err))
        })
    }

    pub fn check(&self) -> PyResult<()> {
        match self.0.get() {
            None => Ok(()),
            Some(why) => Err(to_py(Error::internal(format!(
                "this object is unusable since an earlier call failed with: {why}; \
                 create a new one"
            )))),
        }
    }

    /// Poisons the object directly (a batch call that panicked poisons
    /// every session it was writing).
    pub fn set(&self, why: &PyErr) {
        let _ = self.0.set(why.to_string());
    }
}
