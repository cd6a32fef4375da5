//! `quantize_rows`: float rows into a block format, as ggml writes them,
//! for `oxillama quantize`.

use numpy::PyReadonlyArray1;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::exceptions::{guard, IntoPyResult};
use crate::quant::quantize::{quantize_rows as quantize_core, row_quantizer};
use crate::quant::GgmlType;
use crate::threadpool::{physical_cores, shared_pool};

fn writable(type_id: u32) -> PyResult<GgmlType> {
    let t = GgmlType::from_u32(type_id)
        .ok_or_else(|| PyValueError::new_err(format!("unknown GGML type id {type_id}")))?;
    row_quantizer(t)
        .map(|_| t)
        .ok_or_else(|| PyValueError::new_err(format!("no quantizer writes {}", t.name())))
}

/// Quantizes `x` (whole rows of `n_per_row` floats, flat) into `type_id`'s
/// blocks; `imatrix` (one weight per column) steers the formats whose ggml
/// quantizer takes one. Rows run in parallel on the process's shared pool
/// of `threads` (default: the physical cores), without the GIL.
#[pyfunction]
#[pyo3(signature = (type_id, x, n_per_row, imatrix=None, threads=None))]
fn quantize_rows<'py>(
    py: Python<'py>,
    type_id: u32,
    x: PyReadonlyArray1<'_, f32>,
    n_per_row: usize,
    imatrix: Option<PyReadonlyArray1<'_, f32>>,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyBytes>> {
    let t = writable(type_id)?;
    let src = x.as_slice()?;
    let w = match &imatrix {
        Some(a) => Some(a.as_slice()?),
        None => None,
    };
    let rb = t
        .row_bytes(n_per_row)
        .filter(|_| n_per_row > 0 && src.len().is_multiple_of(n_per_row))
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "{} floats are not whole rows of {n_per_row} in {} blocks of {}",
                src.len(),
                t.name(),
                t.block_size()
            ))
        })?;
    let len = src.len() / n_per_row * rb;
    let threads = threads.unwrap_or_else(physical_cores).max(1);
    PyBytes::new_with(py, len, |out| {
        guard(|| {
            py.detach(|| {
                let pool = shared_pool(threads);
                quantize_core(t, src, n_per_row, w, out, Some(&pool))
            })
            .py_err()
        })
    })
}

/// Whether `quantize_rows` writes `type_id`.
#[pyfunction]
fn can_quantize(type_id: u32) -> bool {
    GgmlType::from_u32(type_id).is_some_and(|t| row_quantizer(t).is_some())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(quantize_rows, m)?)?;
    m.add_function(wrap_pyfunction!(can_quantize, m)?)?;
    Ok(())
}
