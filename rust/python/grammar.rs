//! `VocabTrie`, `GrammarProgram` and `GrammarMatcher`: thin wrappers over
//! `crate::grammar`. Masks are computed without the GIL.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::exceptions::{guard, IntoPyResult, Poison};
use crate::grammar::{LocalCache, Matcher, Program, VocabTrie};
use crate::Error;

#[pyclass(name = "VocabTrie", module = "oxillama._native", frozen)]
pub struct PyVocabTrie {
    inner: Arc<VocabTrie>,
}

#[pymethods]
impl PyVocabTrie {
    /// `pieces[i]`: token i's bytes; `special[i]`: a control token, matched
    /// only by token references; `eog`: end-of-generation ids.
    #[new]
    fn new(
        py: Python<'_>,
        pieces: Vec<Vec<u8>>,
        special: Vec<bool>,
        eog: Vec<u32>,
    ) -> PyResult<Self> {
        let inner = guard(|| Ok(py.detach(|| VocabTrie::new(pieces, special, eog))))?;
        Ok(PyVocabTrie {
            inner: Arc::new(inner),
        })
    }

    #[getter]
    fn n_vocab(&self) -> usize {
        self.inner.n_vocab()
    }

    #[getter]
    fn n_nodes(&self) -> usize {
        self.inner.n_nodes()
    }
}

#[pyclass(name = "GrammarProgram", module = "oxillama._native", frozen)]
pub struct PyProgram {
    inner: Arc<Program>,
    /// One shared mask cache per vocabulary this program runs on.
    caches: Mutex<Vec<(Arc<VocabTrie>, Arc<LocalCache>)>>,
}

impl PyProgram {
    fn cache_for(&self, trie: &Arc<VocabTrie>) -> Arc<LocalCache> {
        let mut caches = self.caches.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, c)) = caches.iter().find(|(t, _)| Arc::ptr_eq(t, trie)) {
            return Arc::clone(c);
        }
        let c = Arc::new(LocalCache::default());
        caches.push((Arc::clone(trie), Arc::clone(&c)));
        c
    }
}

#[pymethods]
impl PyProgram {
    /// Decodes (and checks) a program written by `oxillama.grammar.compile`.
    #[new]
    fn new(words: Vec<u32>) -> PyResult<Self> {
        Ok(PyProgram {
            inner: Arc::new(guard(|| Program::decode(&words).py_err())?),
            caches: Mutex::new(Vec::new()),
        })
    }

    #[getter]
    fn n_rules(&self) -> usize {
        self.inner.rules.len()
    }
}

#[pyclass(name = "GrammarMatcher", module = "oxillama._native")]
pub struct PyMatcher {
    inner: Matcher,
    bits: Vec<u64>,
    poison: Poison,
}

fn token(t: i64) -> PyResult<u32> {
    u32::try_from(t)
        .map_err(|_| Error::invalid(format!("token id {t} is out of range")))
        .py_err()
}

#[pymethods]
impl PyMatcher {
    #[new]
    fn new(program: &PyProgram, trie: &PyVocabTrie) -> PyResult<Self> {
        let words = trie.inner.n_vocab().div_ceil(64);
        let inner = guard(|| {
            Matcher::with_cache(
                Arc::clone(&program.inner),
                Arc::clone(&trie.inner),
                program.cache_for(&trie.inner),
            )
            .py_err()
        })?;
        Ok(PyMatcher {
            inner,
            bits: vec![0; words],
            poison: Poison::default(),
        })
    }

    /// Advances by `token` if allowed; returns whether it was.
    fn accept_token(&mut self, py: Python<'_>, token_id: i64) -> PyResult<bool> {
        let t = token(token_id)?;
        let inner = &mut self.inner;
        self.poison
            .run(|| py.detach(|| inner.accept_token(t)).py_err())
    }

    /// Advances by raw bytes if allowed; returns whether they were.
    fn accept_bytes(&mut self, data: &[u8]) -> PyResult<bool> {
        let inner = &mut self.inner;
        self.poison.run(|| inner.accept_bytes(data).py_err())
    }

    /// Undoes the last `n` accepted tokens.
    fn rollback(&mut self, n: usize) -> PyResult<()> {
        let inner = &mut self.inner;
        self.poison.run(|| inner.rollback(n).py_err())
    }

    fn reset(&mut self) -> PyResult<()> {
        let inner = &mut self.inner;
        self.poison.run(|| {
            inner.reset();
            Ok(())
        })
    }

    fn is_accepting(&self) -> PyResult<bool> {
        self.poison.run(|| Ok(self.inner.is_accepting()))
    }

    fn is_terminated(&self) -> PyResult<bool> {
        self.poison.run(|| Ok(self.inner.is_terminated()))
    }

    #[getter]
    fn n_accepted(&self) -> usize {
        self.inner.n_accepted()
    }

    /// The allowed tokens as a bitset: bit `i % 8` of byte `i // 8`
    /// (`numpy.packbits(..., bitorder="little")`), the form
    /// `Sampler.sample(logits, allowed)` takes.
    fn mask<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let PyMatcher {
            inner,
            bits,
            poison,
        } = self;
        poison.run(|| py.detach(|| inner.fill_mask(bits)).py_err())?;
        let mut out = Vec::with_capacity(bits.len() * 8);
        for w in bits.iter() {
            out.extend_from_slice(&w.to_le_bytes());
        }
        Ok(PyBytes::new(py, &out))
    }

    /// The fewest bytes that finish the grammar from here (a token
    /// reference counts one), or None; allocation-free.
    fn min_completion_bytes(&self) -> PyResult<Option<u32>> {
        self.poison.run(|| Ok(self.inner.min_completion_bytes()))
    }

    /// The tokens that finish the grammar from here along a shortest
    /// completion (spelled with as few tokens as possible), or None when
    /// no completion spells out as text.
    fn min_completion_tokens(&self, py: Python<'_>) -> PyResult<Option<u32>> {
        let inner = &self.inner;
        self.poison
            .run(|| Ok(py.detach(|| inner.min_completion_tokens())))
    }

    /// The tokens that start that completion and let it finish within
    /// `left` tokens (see `Matcher::shortest_path_tokens`) as a bitset like
    /// `mask()`, or None.
    fn shortest_path_mask<'py>(
        &self,
        py: Python<'py>,
        left: u32,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let inner = &self.inner;
        let toks = self
            .poison
            .run(|| Ok(py.detach(|| inner.shortest_path_tokens(left))))?;
        Ok(toks.map(|toks| {
            let mut out = vec![0u8; self.bits.len() * 8];
            for t in toks {
                if let Some(b) = out.get_mut(t as usize / 8) {
                    *b |= 1 << (t % 8);
                }
            }
            PyBytes::new(py, &out)
        }))
    }

    /// The live state as a list of ints, for snapshots.
    fn export_state(&self) -> PyResult<Vec<u32>> {
        self.poison.run(|| Ok(self.inner.export_state()))
    }

    /// Restores an `export_state()` list (the history restarts there).
    fn import_state(&mut self, state: Vec<u32>) -> PyResult<()> {
        let inner = &mut self.inner;
        self.poison.run(|| inner.import_state(&state).py_err())
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyVocabTrie>()?;
    m.add_class::<PyProgram>()?;
    m.add_class::<PyMatcher>()
}
