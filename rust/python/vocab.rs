//! Tokenizer tables built natively at load time (see `crate::vocab`).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyList, PyString, PyTuple};
use rustc_hash::FxHashMap;

use super::gguf::PyGgufFile;
use crate::gguf::{Array, Value};
use crate::vocab::{byte_level_piece, merge_split, piece_kind, PieceKind};

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

/// The str objects of a vocabulary, with their text borrowed from them.
fn strs<'py>(list: &Bound<'py, PyList>) -> PyResult<Vec<Bound<'py, PyString>>> {
    list.iter()
        .map(|t| t.cast_into::<PyString>().map_err(PyErr::from))
        .collect()
}

/// Splits merge rules into pairs of str. A part that is a token is that
/// token's own str object: most of the ~100k parts are, and new strings for
/// them were most of the cost.
struct Splitter<'a, 'py> {
    py: Python<'py>,
    toks: &'a [Bound<'py, PyString>],
    known: FxHashMap<&'a str, usize>,
}

impl<'a, 'py> Splitter<'a, 'py> {
    fn new(py: Python<'py>, toks: &'a [Bound<'py, PyString>]) -> PyResult<Self> {
        let mut known = FxHashMap::default();
        known.reserve(toks.len());
        for (i, t) in toks.iter().enumerate() {
            known.insert(t.to_str()?, i);
        }
        Ok(Splitter { py, toks, known })
    }

    fn part(&self, s: &str) -> Bound<'py, PyString> {
        match self.known.get(s) {
            Some(&i) => self.toks[i].clone(),
            None => PyString::new(self.py, s),
        }
    }

    /// `None`: the rule is not two parts.
    fn pair(&self, rule: &str) -> PyResult<Option<Bound<'py, PyTuple>>> {
        match merge_split(rule) {
            Some(at) => {
                let pair = [self.part(&rule[..at]), self.part(&rule[at + 1..])];
                Ok(Some(PyTuple::new(self.py, pair)?))
            }
            None => Ok(None),
        }
    }
}

/// Merge rules split into their two parts, and the index of the first rule
/// that is not two parts (-1: none; the caller names it in its error).
/// Parts that are tokens of `tokens` share those tokens' str objects.
#[pyfunction]
#[pyo3(signature = (rules, tokens=None))]
fn split_merges<'py>(
    py: Python<'py>,
    rules: &Bound<'py, PyList>,
    tokens: Option<&Bound<'py, PyList>>,
) -> PyResult<(Bound<'py, PyList>, i64)> {
    let toks = match tokens {
        Some(t) => strs(t)?,
        None => Vec::new(),
    };
    let splitter = Splitter::new(py, &toks)?;
    let mut out = Vec::with_capacity(rules.len());
    for (i, rule) in rules.iter().enumerate() {
        let rule = rule.cast_into::<PyString>()?;
        match splitter.pair(rule.to_str()?)? {
            Some(pair) => out.push(pair),
            None => return Ok((PyList::empty(py), i as i64)),
        }
    }
    Ok((PyList::new(py, out)?, -1))
}

/// `split_merges` of a file's own `tokenizer.ggml.merges`, read from the
/// parsed file rather than from Python strings: a Python str that is not
/// ASCII (about half the rules) would first be encoded to UTF-8 again just
/// to be split. `None` when the file has no list of string merges.
#[pyfunction]
fn split_file_merges<'py>(
    py: Python<'py>,
    file: &PyGgufFile,
    tokens: &Bound<'py, PyList>,
) -> PyResult<Option<(Bound<'py, PyList>, i64)>> {
    let Some(Value::Array(Array::Str(rules))) = file.inner.get("tokenizer.ggml.merges") else {
        return Ok(None);
    };
    let toks = strs(tokens)?;
    let splitter = Splitter::new(py, &toks)?;
    let mut out = Vec::with_capacity(rules.len());
    for (i, rule) in rules.iter().enumerate() {
        match splitter.pair(rule)? {
            Some(pair) => out.push(pair),
            None => return Ok(Some((PyList::empty(py), i as i64))),
        }
    }
    Ok(Some((PyList::new(py, out)?, -1)))
}

/// Each byte-level BPE token's bytes as llama.cpp's `token_to_piece`
/// (special=true) gives them, from its text and attribute bits; and the ids
/// left to the caller (byte tokens, none in the usual vocabulary), whose
/// slots hold `b""`.
#[pyfunction]
fn bpe_token_pieces<'py>(
    py: Python<'py>,
    tokens: &Bound<'py, PyList>,
    attrs: Vec<i64>,
) -> PyResult<(Bound<'py, PyList>, Vec<usize>)> {
    let toks = strs(tokens)?;
    if toks.len() != attrs.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{} tokens but {} attributes",
            toks.len(),
            attrs.len()
        )));
    }
    let mut buf = Vec::with_capacity(64);
    let mut rest = Vec::new();
    let mut out = Vec::with_capacity(toks.len());
    for (i, (t, &a)) in toks.iter().zip(&attrs).enumerate() {
        let text = t.to_str()?;
        let piece = match piece_kind(a) {
            PieceKind::Text => PyBytes::new(py, text.as_bytes()),
            PieceKind::ByteLevel => {
                byte_level_piece(text, &mut buf);
                PyBytes::new(py, &buf)
            }
            PieceKind::Byte => {
                rest.push(i);
                PyBytes::new(py, b"")
            }
            PieceKind::Empty => PyBytes::new(py, b""),
        };
        out.push(piece);
    }
    Ok((PyList::new(py, out)?, rest))
}

/// A vocabulary column as a list of str: str items as they are (shared, not
/// copied), anything else through `str()`, as `list(map(str, items))` gives
/// but without a Python call per item.
#[pyfunction]
fn str_list<'py>(py: Python<'py>, items: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    let mut out = Vec::with_capacity(items.len().unwrap_or(0));
    for item in items.try_iter()? {
        let item = item?;
        out.push(match item.cast_exact::<PyString>() {
            Ok(s) => s.clone(),
            Err(_) => item.str()?,
        });
    }
    PyList::new(py, out)
}

/// Each token type's attribute bits through `table` (types outside it: 0),
/// for the first `n` types; `None` when a type is not an int, for the
/// caller's general path.
#[pyfunction]
fn token_type_attrs(types: &Bound<'_, PyAny>, n: usize, table: Vec<i64>) -> Option<Vec<i64>> {
    let mut out = Vec::with_capacity(n);
    for item in types.try_iter().ok()?.take(n) {
        let t: i64 = item.ok()?.cast_exact::<PyInt>().ok()?.extract().ok()?;
        let attr = usize::try_from(t).ok().and_then(|i| table.get(i)).copied();
        out.push(attr.unwrap_or(0));
    }
    Some(out)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(str_list, m)?)?;
    m.add_function(wrap_pyfunction!(token_type_attrs, m)?)?;
    m.add_function(wrap_pyfunction!(byte_level_pieces, m)?)?;
    m.add_function(wrap_pyfunction!(split_merges, m)?)?;
    m.add_function(wrap_pyfunction!(split_file_merges, m)?)?;
    m.add_function(wrap_pyfunction!(bpe_token_pieces, m)?)
}
