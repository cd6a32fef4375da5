//! The single place where core errors become Python exceptions. The classes
//! are declared once, in `oxillama/errors.py`, so Python code can subclass
//! and catch them without importing the extension.

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
