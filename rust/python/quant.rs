//! Kernel entry points for tests and tools: dequantize, quantize, dot.

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::exceptions::{guard, IntoPyResult};
use crate::quant::{dequantize_row, kernels, scalar_kernels, simd_level, GgmlType};

fn ty(type_id: u32) -> PyResult<GgmlType> {
    GgmlType::from_u32(type_id)
        .ok_or_else(|| PyValueError::new_err(format!("unknown GGML type id {type_id}")))
}

/// Dequantizes `n` elements of `type_id` from raw block bytes.
#[pyfunction]
fn dequantize<'py>(
    py: Python<'py>,
    type_id: u32,
    data: &[u8],
    n: usize,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let t = ty(type_id)?;
    // Checked before allocating: `n` comes from the caller, `data` is real.
    if t.row_bytes(n) != Some(data.len()) {
        return Err(PyValueError::new_err(format!(
            "{} elements of {} need {:?} bytes, got {}",
            n,
            t.name(),
            t.row_bytes(n),
            data.len()
        )));
    }
    let mut out = vec![0f32; n];
    guard(|| py.detach(|| dequantize_row(t, data, &mut out)).py_err())?;
    Ok(PyArray1::from_vec(py, out))
}

/// Quantizes activations into the partner format of weight type `type_id`.
#[pyfunction]
fn quantize_act<'py>(
    py: Python<'py>,
    type_id: u32,
    x: PyReadonlyArray1<'_, f32>,
) -> PyResult<Bound<'py, PyBytes>> {
    let t = ty(type_id)?;
    let k =
        kernels(t).ok_or_else(|| PyValueError::new_err(format!("no kernel for {}", t.name())))?;
    let x = x.as_slice()?;
    let len = k.act.row_bytes(x.len()).ok_or_else(|| {
        PyValueError::new_err(format!(
            "{} elements are not whole {} blocks",
            x.len(),
            k.act.name()
        ))
    })?;
    let mut out = vec![0u8; len];
    guard(|| {
        (k.quantize_act)(x, &mut out);
        Ok(())
    })?;
    Ok(PyBytes::new(py, &out))
}

/// Dot of `n` weights with activations from `quantize_act`; `scalar=True`
/// forces the portable twin.
#[pyfunction]
#[pyo3(signature = (type_id, w, a, n, scalar=false))]
fn vec_dot(type_id: u32, w: &[u8], a: &[u8], n: usize, scalar: bool) -> PyResult<f32> {
    let t = ty(type_id)?;
    let k = if scalar {
        scalar_kernels(t)
    } else {
        kernels(t)
    }
    .ok_or_else(|| PyValueError::new_err(format!("no kernel for {}", t.name())))?;
    let ok = t.row_bytes(n) == Some(w.len()) && k.act.row_bytes(n) == Some(a.len());
    if !ok {
        return Err(PyValueError::new_err("buffer sizes do not match n"));
    }
    guard(|| Ok((k.vec_dot)(n, w, a)))
}

/// The SIMD level the kernels dispatched to ("avx512vnni", "avx2" or "scalar").
#[pyfunction(name = "simd_level")]
fn py_simd_level() -> &'static str {
    simd_level()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(quantize_act, m)?)?;
    m.add_function(wrap_pyfunction!(vec_dot, m)?)?;
    m.add_function(wrap_pyfunction!(py_simd_level, m)?)?;
    Ok(())
}
