//! Reading any contiguous Python buffer (bytes, bytearray, memoryview,
//! numpy arrays) as a byte slice, without copying it.
//!
//! The wheel is built for CPython's stable ABI from 3.10 on (abi3), where
//! PyO3 offers no buffer protocol: `PyObject_GetBuffer` and `Py_buffer`
//! joined the limited API only in 3.11. Both have had the same signature
//! and layout since Python 3.3 and every CPython exports them, so
//! [`Export`] declares them itself rather than giving up zero-copy reads
//! (a snapshot's KV is tens of megabytes) on every interpreter.

use std::ffi::{c_char, c_int, c_void};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// CPython's `Py_buffer`, field for field (Include/pybuffer.h).
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut pyo3::ffi::PyObject,
    len: isize,
    itemsize: isize,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut isize,
    strides: *mut isize,
    suboffsets: *mut isize,
    internal: *mut c_void,
}

extern "C" {
    fn PyObject_GetBuffer(
        obj: *mut pyo3::ffi::PyObject,
        view: *mut RawBuffer,
        flags: c_int,
    ) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

/// `PyBUF_SIMPLE`: one contiguous run of bytes, no shape or strides (an
/// exporter that cannot give that, a strided numpy view say, raises).
const PYBUF_SIMPLE: c_int = 0;
/// `PyBUF_WRITABLE`: the same, and writable (read-only exporters raise).
const PYBUF_WRITABLE: c_int = 0x0001;
/// `PyBUF_WRITE` for `PyMemoryView_FromMemory` (not in PyO3's abi3 ffi).
const PYBUF_WRITE: c_int = 0x0200;

/// A contiguous buffer export of a Python object, released on drop.
pub struct Export {
    raw: RawBuffer,
}

impl Export {
    /// Asks `obj` for its bytes as one contiguous run (writable if
    /// `writable`); the exporter's own error (BufferError, TypeError) if it
    /// cannot.
    pub fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Self> {
        let mut raw = std::mem::MaybeUninit::<RawBuffer>::zeroed();
        let flags = if writable {
            PYBUF_WRITABLE
        } else {
            PYBUF_SIMPLE
        };
        // SAFETY: `obj` is a live object (the Bound holds a reference and
        // the GIL); `raw` is a zeroed Py_buffer of CPython's layout, which
        // PyObject_GetBuffer fills on success and leaves unowned on failure.
        let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), raw.as_mut_ptr(), flags) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        // SAFETY: rc == 0, so CPython initialised every field.
        let raw = unsafe { raw.assume_init() };
        Ok(Self { raw })
    }

    fn len(&self) -> usize {
        usize::try_from(self.raw.len).unwrap_or(0)
    }

    /// Whether the exporter offered the memory read-only (`bytes`, a
    /// read-only mapping or memoryview): no Python code can write it.
    pub fn readonly(&self) -> bool {
        self.raw.readonly != 0
    }

    /// The exported bytes. The export keeps the memory allocated and the
    /// object from resizing while `self` lives.
    pub fn bytes(&self) -> &[u8] {
        if self.len() == 0 {
            return &[];
        }
        // SAFETY: a successful simple export is `len` contiguous bytes at
        // `buf`, valid until PyBuffer_Release (in Drop, after any borrow of
        // `self` ends).
        unsafe { std::slice::from_raw_parts(self.raw.buf as *const u8, self.len()) }
    }

    /// The exported bytes, writable (an export made with `writable`).
    fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len() == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and the export was asked for writable
        // memory (PyBUF_WRITABLE), which read-only exporters refuse; the
        // &mut borrow of `self` keeps this the only Rust view of it.
        unsafe { std::slice::from_raw_parts_mut(self.raw.buf as *mut u8, self.len()) }
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        // PyBuffer_Release needs the GIL; the export may be dropped after a
        // detached section.
        Python::attach(|_| {
            // SAFETY: `raw` came from a successful PyObject_GetBuffer and is
            // released exactly once, here.
            unsafe { PyBuffer_Release(&mut self.raw) }
        });
    }
}

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
    // The GIL stays held, so no Python code can write the object while
    // `f` reads it.
    let export = Export::get(obj, false).map_err(|e| contiguous_error(obj.py(), e, false))?;
    Ok(f(export.bytes()))
}

/// The exporter's refusal, said in this module's words (the old messages,
/// which callers and tests know), with the exporter's error as the cause.
fn contiguous_error(py: Python<'_>, cause: PyErr, writable: bool) -> PyErr {
    let e = PyValueError::new_err(if writable {
        "expected a writable contiguous buffer (bytearray, memoryview)"
    } else {
        "expected a contiguous bytes-like buffer"
    });
    e.set_cause(py, Some(cause));
    e
}

/// Runs `f` on the bytes of a writable contiguous buffer (bytearray, a
/// writable memoryview), with the GIL held.
pub fn with_bytes_mut<R>(obj: &Bound<'_, PyAny>, f: impl FnOnce(&mut [u8]) -> R) -> PyResult<R> {
    // The GIL stays held, so no Python code touches the object while `f`
    // runs.
    let mut export = Export::get(obj, true).map_err(|e| contiguous_error(obj.py(), e, true))?;
    Ok(f(export.bytes_mut()))
}

/// A new `bytes` object of `n` bytes that `fill(view)` writes through a
/// writable memoryview before any other code can see the object: one
/// allocation and one pass over the memory, where a bytearray filled and
/// then copied into bytes costs a zeroing pass, a second allocation and a
/// copy (8 ms of a 13 MB snapshot's 13 ms, measured). `fill` must not keep
/// the view: it is released when `fill` returns.
#[pyfunction]
pub fn filled_bytes<'py>(
    py: Python<'py>,
    n: usize,
    fill: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let len = isize::try_from(n)
        .map_err(|_| PyValueError::new_err(format!("{n} bytes is too large a bytes object")))?;
    // SAFETY: a null source asks CPython for a new bytes object of `len`
    // uninitialised bytes; we receive the only (owned) reference or NULL
    // with an exception set, which `from_owned_ptr_or_err` turns into Err.
    let obj = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), len),
        )?
    };
    // SAFETY: `obj` is a bytes object (just created), so PyBytes_AsString
    // returns its buffer of `len` bytes; nothing else references `obj`, so
    // writing it before it is returned breaks no one's view of immutability.
    let ptr = unsafe { pyo3::ffi::PyBytes_AsString(obj.as_ptr()) };
    // SAFETY: `ptr` is valid for `len` bytes while `obj` lives, which is
    // longer than the view: the view is released below, before returning.
    let view = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            pyo3::ffi::PyMemoryView_FromMemory(ptr, len, PYBUF_WRITE),
        )?
    };
    let filled = fill.call1((&view,));
    if let Err(e) = view.call_method0("release") {
        // Something still exports the view (a slice kept by `fill`): its
        // memory must outlive it, so the object is never freed.
        std::mem::forget(obj);
        return Err(e);
    }
    filled?;
    Ok(obj.cast_into::<PyBytes>()?)
}
