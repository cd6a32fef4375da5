//! `LoraAdapter`: an adapter file checked against a model, shared by every
//! session that activates it (the tensors are held once).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::exceptions::{guard, IntoPyResult};
use super::gguf::PyGgufFile;
use super::model::PyModel;
use crate::lora::LoraAdapter;

#[pyclass(name = "LoraAdapter", module = "oxillama._native", frozen)]
pub struct PyLoraAdapter {
    pub inner: Arc<LoraAdapter>,
}

#[pymethods]
impl PyLoraAdapter {
    /// Reads and checks `file` (a GGUF LoRA adapter) against `model`.
    #[new]
    fn new(py: Python<'_>, model: &PyModel, file: &PyGgufFile) -> PyResult<Self> {
        let (m, f) = (model.arc(), Arc::clone(&file.inner));
        let a = guard(|| py.detach(|| LoraAdapter::load(&f, &m.lora_base())).py_err())?;
        Ok(PyLoraAdapter { inner: Arc::new(a) })
    }

    /// `adapter.lora.alpha` (0 when the file has none: scales apply as given).
    #[getter]
    fn alpha(&self) -> f32 {
        self.inner.alpha
    }

    #[getter]
    fn arch(&self) -> &str {
        &self.inner.arch
    }

    /// `general.name`, if the file has one.
    #[getter]
    fn name(&self) -> Option<&str> {
        self.inner.name.as_deref()
    }

    /// Base tensor name -> rank, in file order.
    fn ranks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for w in &self.inner.weights {
            d.set_item(&w.name, w.rank)?;
        }
        Ok(d)
    }

    /// Base tensor name -> "f16" or "f32" (how its pair is held).
    fn dtypes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for w in &self.inner.weights {
            let f16 = w.a.is_f16() && w.bt.is_f16();
            let mixed = w.a.is_f16() != w.bt.is_f16();
            d.set_item(
                &w.name,
                if mixed {
                    "mixed"
                } else if f16 {
                    "f16"
                } else {
                    "f32"
                },
            )?;
        }
        Ok(d)
    }

    /// Bytes of the adapter's tensors in memory.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }
}
