//! PyO3 bindings: thin `Py*` wrappers over the core. This file only registers.

use pyo3::prelude::*;

mod buffer;
mod engine;
mod exceptions;
mod gguf;
mod grammar;
mod lora;
mod model;
mod quant;
mod quantize;
mod sampler;
mod testing;
mod vocab;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    gguf::register(m)?;
    quant::register(m)?;
    quantize::register(m)?;
    sampler::register(m)?;
    engine::register(m)?;
    grammar::register(m)?;
    testing::register(m)?;
    vocab::register(m)?;
    Ok(())
}
