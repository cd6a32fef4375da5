//! Tokenizer tables built natively at load time (see `crate::vocab`).

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::vocab::{byte_level_piece, merge_split};

/// The raw bytes of each byte-level BPE token.
#[pyfunction]
fn byte_level_pieces<'py>(py: Python<'py>, tokens: Vec<String>) -> Vec<Bound<'py, PyBytes>> {
    let mut buf = Vec::with_capacity(64);
    tokens
        .iter()
        .map(|t| {
            byte_level_piece(t, &mut buf);
            PyBytes::new(py, &buf)
        })
        .collect()
}

/// Merge rules split into their two parts, and the index of the first rule
/// that is not two parts (-1: none; the caller names it in its error).
#[pyfunction]
fn split_merges(rules: Vec<String>) -> (Vec<(String, String)>, i64) {
    let mut out = Vec::with_capacity(rules.len());
    for (i, rule) in rules.iter().enumerate() {
        match merge_split(rule) {
            Some(at) => out.push((rule[..at].to_owned(), rule[at + 1..].to_owned())),
            None => return (Vec::new(), i as i64),
        }
    }
    (out, -1)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(byte_level_pieces, m)?)?;
    m.add_function(wrap_pyfunction!(split_merges, m)?)
}
