//! The `Model` class's Rust side: shared, immutable weights. Its Python
//! methods are in `engine.rs`, beside the sessions, because some take
//! adapters; `lora.rs` checks an adapter against it. Keeping the type here
//! lets both import it without importing each other.

use std::sync::Arc;

use pyo3::prelude::*;

use crate::model::Model;

#[pyclass(name = "Model", module = "oxillama._native", frozen)]
pub struct PyModel {
    pub(super) inner: Arc<Model>,
}

impl PyModel {
    pub fn arc(&self) -> Arc<Model> {
        Arc::clone(&self.inner)
    }
}
