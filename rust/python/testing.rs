//! `_panic_for_test`: deliberate panics, so the tests can show that a bug in
//! the core reaches Python as `InternalError` and leaves the process (and
//! its thread pools) working.

use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::exceptions::guard;
use crate::threadpool::{arm_worker_panic, shared_pool, worker_panic_armed};

/// `where`: "main" panics on the calling thread (GIL released, as in a
/// forward pass); "worker" panics inside a worker of a two-thread pool;
/// "next-dispatch" arms a panic in the next worker that joins any dispatch
/// (the next multi-threaded `Session.eval`, say) and returns.
#[pyfunction(name = "_panic_for_test")]
fn panic_for_test(py: Python<'_>, r#where: &str) -> PyResult<()> {
    match r#where {
        "main" => guard(|| py.detach(|| panic!("test panic on the calling thread"))),
        "worker" => guard(|| {
            py.detach(|| {
                arm_worker_panic();
                let pool = shared_pool(2);
                // The caller's chunks wait until the worker has joined, so the
                // panic lands on a worker, not on the calling thread.
                let deadline = Instant::now() + Duration::from_secs(10);
                pool.run(2, |_| {
                    while worker_panic_armed() && Instant::now() < deadline {
                        std::thread::yield_now();
                    }
                });
            });
            Err(PyValueError::new_err(
                "no worker thread joined the dispatch within 10 s",
            ))
        }),
        "next-dispatch" => {
            arm_worker_panic();
            Ok(())
        }
        other => Err(PyValueError::new_err(format!(
            "where must be 'main', 'worker' or 'next-dispatch', not {other:?}"
        ))),
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(panic_for_test, m)?)
}
