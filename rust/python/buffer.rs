//! Reading any contiguous Python buffer (bytes, bytearray, memoryview,
//! numpy arrays) as a byte slice, without copying it.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Runs `f` on the bytes of `obj`. Immutable `bytes` are read with the GIL
/// released (nothing can change them); any other buffer keeps the GIL, so
/// no Python thread can write to it while `f` reads.
pub fn with_bytes<R: Send>(
    obj: &Bound<'_, PyAny>,
    f: impl FnOnce(&[u8]) -> R + Send,
) -> PyResult<R> {
    let py = obj.py();
    if let Ok(b) = obj.cast::<PyBytes>() {
        let data = b.as_bytes();
        return Ok(py.detach(|| f(data)));
    }
    let buf = PyBuffer::<u8>::get(obj)?;
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err(
            "expected a contiguous bytes-like buffer",
        ));
    }
    // SAFETY: `buf` holds the export for this whole call, so the memory at
    // buf_ptr() stays allocated and of len_bytes() bytes; the GIL stays held,
    // so no Python code can resize or write the object while `f` reads it.
    let data = unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const u8, buf.len_bytes()) };
    Ok(f(data))
}

/// Runs `f` on the bytes of a writable contiguous buffer (bytearray, a
/// writable memoryview), with the GIL held.
pub fn with_bytes_mut<R>(obj: &Bound<'_, PyAny>, f: impl FnOnce(&mut [u8]) -> R) -> PyResult<R> {
    let buf = PyBuffer::<u8>::get(obj)?;
    if buf.readonly() {
        return Err(PyValueError::new_err(
            "expected a writable buffer (bytearray, memoryview)",
        ));
    }
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err("expected a contiguous buffer"));
    }
    // SAFETY: `buf` holds a writable export for this whole call, so the
    // memory stays allocated, len_bytes() long and writable; the GIL stays
    // held, so no Python code touches the object while `f` runs, and no
    // other Rust reference to it exists.
    let data = unsafe { std::slice::from_raw_parts_mut(buf.buf_ptr() as *mut u8, buf.len_bytes()) };
    Ok(f(data))
}
