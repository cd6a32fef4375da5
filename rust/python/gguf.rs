//! `GgufFile`: the parsed model file, for metadata and `oxillama info`.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use super::exceptions::{guard, IntoPyResult};
use crate::gguf::{Array, GgufFile, Value};

#[pyclass(name = "GgufFile", module = "oxillama._native", frozen)]
pub struct PyGgufFile {
    pub inner: Arc<GgufFile>,
}

fn array_to_py<'py>(py: Python<'py>, a: &Array) -> PyResult<Bound<'py, PyAny>> {
    Ok(match a {
        Array::U8(v) => PyList::new(py, v)?.into_any(),
        Array::I8(v) => PyList::new(py, v)?.into_any(),
        Array::U16(v) => PyList::new(py, v)?.into_any(),
        Array::I16(v) => PyList::new(py, v)?.into_any(),
        Array::U32(v) => PyList::new(py, v)?.into_any(),
        Array::I32(v) => PyList::new(py, v)?.into_any(),
        Array::F32(v) => PyList::new(py, v)?.into_any(),
        Array::Bool(v) => PyList::new(py, v)?.into_any(),
        Array::Str(v) => PyList::new(py, v)?.into_any(),
        Array::U64(v) => PyList::new(py, v)?.into_any(),
        Array::I64(v) => PyList::new(py, v)?.into_any(),
        Array::F64(v) => PyList::new(py, v)?.into_any(),
        Array::Array(v) => {
            let items = v
                .iter()
                .map(|x| array_to_py(py, x))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
    })
}

fn value_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::U8(x) => x.into_pyobject(py)?.into_any(),
        Value::I8(x) => x.into_pyobject(py)?.into_any(),
        Value::U16(x) => x.into_pyobject(py)?.into_any(),
        Value::I16(x) => x.into_pyobject(py)?.into_any(),
        Value::U32(x) => x.into_pyobject(py)?.into_any(),
        Value::I32(x) => x.into_pyobject(py)?.into_any(),
        Value::U64(x) => x.into_pyobject(py)?.into_any(),
        Value::I64(x) => x.into_pyobject(py)?.into_any(),
        Value::F32(x) => x.into_pyobject(py)?.into_any(),
        Value::F64(x) => x.into_pyobject(py)?.into_any(),
        Value::Bool(x) => x.into_pyobject(py)?.to_owned().into_any(),
        Value::Str(x) => x.into_pyobject(py)?.into_any(),
        Value::Array(a) => array_to_py(py, a)?,
    })
}

#[pymethods]
impl PyGgufFile {
    /// Memory-maps and parses a GGUF file.
    #[staticmethod]
    fn open(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let f = guard(|| py.detach(|| GgufFile::open(&path)).py_err())?;
        Ok(PyGgufFile { inner: Arc::new(f) })
    }

    /// Parses a GGUF image held in memory (copied once into Rust).
    #[staticmethod]
    fn from_bytes(py: Python<'_>, data: &Bound<'_, PyBytes>) -> PyResult<Self> {
        let bytes = data.as_bytes().to_vec();
        let f = guard(|| py.detach(|| GgufFile::from_bytes(bytes)).py_err())?;
        Ok(PyGgufFile { inner: Arc::new(f) })
    }

    #[getter]
    fn version(&self) -> u32 {
        self.inner.version
    }
    #[getter]
    fn alignment(&self) -> u64 {
        self.inner.alignment
    }
    #[getter]
    fn data_offset(&self) -> usize {
        self.inner.data_offset
    }
    #[getter]
    fn file_size(&self) -> usize {
        self.inner.file_size()
    }
    #[getter]
    fn is_mapped(&self) -> bool {
        self.inner.is_mapped()
    }

    /// Every metadata key with its value as a Python object.
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        guard(|| {
            let d = PyDict::new(py);
            for (k, v) in self.inner.metadata() {
                d.set_item(k, value_to_py(py, v)?)?;
            }
            Ok(d)
        })
    }

    /// `(name, type name, dims, absolute offset, nbytes)` per tensor.
    #[allow(clippy::type_complexity)]
    fn tensors(&self) -> PyResult<Vec<(String, &'static str, Vec<u64>, usize, usize)>> {
        guard(|| {
            Ok(self
                .inner
                .tensors()
                .iter()
                .map(|t| {
                    (
                        t.name.clone(),
                        t.ty.name(),
                        t.dims.clone(),
                        t.offset,
                        t.nbytes,
                    )
                })
                .collect())
        })
    }

    /// Raw bytes of one tensor (tests and tools; not used on the hot path).
    fn tensor_bytes<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyBytes>> {
        guard(|| {
            let t = self
                .inner
                .tensor(name)
                .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(name.to_string()))?;
            Ok(PyBytes::new(py, self.inner.tensor_data(t)))
        })
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGgufFile>()
}
