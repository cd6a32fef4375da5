//! `Model` (shared, immutable weights) and `Session` (KV cache + position).

use std::sync::Arc;

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1};
use pyo3::prelude::*;

use super::buffer::{with_bytes, with_bytes_mut};
use pyo3::types::{PyBytes, PyDict};

use super::exceptions::{guard, IntoPyResult, Poison};
use super::gguf::PyGgufFile;
use super::lora::PyLoraAdapter;
use super::model::PyModel;
use crate::lora::ActiveLora;
use crate::model::kv_dtype::{convert_export, convert_export_rot, KvRot, KvShape, KvTypes};
use crate::model::kv_pool::{KvPool, PAGE};
use crate::model::pager::{Evict, OffloadSpec};
use crate::model::{Model, Session};
use crate::threadpool::{physical_cores, shared_pool};

/// The class is declared in `model.rs` (which `lora.rs` imports too).
#[pymethods]
impl PyModel {
    #[new]
    fn new(py: Python<'_>, file: &PyGgufFile) -> PyResult<Self> {
        let f = Arc::clone(&file.inner);
        let m = guard(|| py.detach(|| Model::load(f)).py_err())?;
        Ok(PyModel { inner: Arc::new(m) })
    }

    /// Starts building the repacked weights on a background thread (see
    /// `Model::prepare_weights`); returns at once.
    fn prepare_weights(&self, threads: usize) {
        self.inner.prepare_weights(threads);
    }

    /// Whether the repacked weights are built (`prepare_weights` done, or a
    /// forward pass has run without an offload budget).
    #[getter]
    fn weights_ready(&self) -> bool {
        self.inner.file.arena_built()
    }

    /// Returns once the repacked weights are built (see
    /// `Model::wait_weights`), with the GIL released.
    fn wait_weights(&self, py: Python<'_>, threads: usize) {
        let m = &self.inner;
        py.detach(|| m.wait_weights(threads));
    }

    #[getter]
    fn arch(&self) -> &str {
        &self.inner.cfg.arch
    }
    #[getter]
    fn n_vocab(&self) -> usize {
        self.inner.n_vocab()
    }
    #[getter]
    fn n_ctx_train(&self) -> usize {
        self.inner.cfg.n_ctx_train
    }

    /// Runs the model under a memory budget (see `oxillama.Budget`); the
    /// pinned units are mapped before this returns.
    #[pyo3(signature = (budget, pin_layers, pin_embeddings, pin_output, evict="lru"))]
    fn set_offload(
        &self,
        py: Python<'_>,
        budget: usize,
        pin_layers: Vec<usize>,
        pin_embeddings: bool,
        pin_output: bool,
        evict: &str,
    ) -> PyResult<()> {
        let spec = OffloadSpec {
            budget,
            pin_layers,
            pin_embeddings,
            pin_output,
            evict: Evict::parse(evict).py_err()?,
        };
        let m = &self.inner;
        guard(|| py.detach(|| m.set_offload(Some(spec))).py_err())
    }

    /// Back to the plain mapped model (pages stay as they are).
    fn clear_offload(&self) -> PyResult<()> {
        guard(|| self.inner.set_offload(None).py_err())
    }

    /// The pager's counters, or None without a budget.
    fn offload_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some((spec, st)) = self.inner.offload() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("budget", spec.budget)?;
        d.set_item("pin_layers", spec.pin_layers)?;
        d.set_item("pin_embeddings", spec.pin_embeddings)?;
        d.set_item("pin_output", spec.pin_output)?;
        d.set_item(
            "evict",
            match spec.evict {
                Evict::Lru => "lru",
                Evict::Furthest => "furthest",
            },
        )?;
        d.set_item("pinned_bytes", st.pinned_bytes)?;
        d.set_item("resident_bytes", st.resident_bytes)?;
        d.set_item("peak_resident_bytes", st.peak_resident_bytes)?;
        d.set_item("layer_loads", st.loads)?;
        d.set_item("evictions", st.evictions)?;
        d.set_item("bytes_read", st.bytes_read)?;
        d.set_item("passes", st.passes)?;
        Ok(Some(d))
    }

    /// The final hidden state of every token of every sequence, `(sum of
    /// lengths, n_embd)` float32, from scratch passes of at most `max_rows`
    /// rows that touch no session. The GIL is released meanwhile.
    /// `loras` (adapter, scale) apply to every row, as in a session.
    #[pyo3(signature = (seqs, threads, max_len, max_rows=2048, loras=Vec::new()))]
    fn embed_hidden<'py>(
        &self,
        py: Python<'py>,
        seqs: Vec<Vec<u32>>,
        threads: usize,
        max_len: usize,
        max_rows: usize,
        loras: Vec<(Bound<'py, PyLoraAdapter>, f32)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let m = &self.inner;
        let rows: usize = seqs.iter().map(Vec::len).sum();
        let e = m.cfg.n_embd;
        let active: Vec<ActiveLora> = loras
            .iter()
            .map(|(a, scale)| ActiveLora {
                adapter: Arc::clone(&a.get().inner),
                scale: *scale,
            })
            .collect();
        let pool = shared_pool(threads.max(1));
        let vk = crate::ops::vec::best();
        let out = guard(|| {
            py.detach(|| {
                crate::model::embed::embed_hidden(m, &pool, vk, &seqs, (max_len, max_rows), &active)
            })
            .py_err()
        })?;
        Ok(PyArray1::from_vec(py, out).reshape([rows, e])?.into_any())
    }

    /// Whether attention is causal (false for an encoder such as BERT).
    #[getter]
    fn causal(&self) -> bool {
        self.inner.cfg.causal
    }

    /// Hyper-parameters as a dict (for `info` and snapshots).
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = &self.inner.cfg;
        let d = PyDict::new(py);
        d.set_item("arch", &c.arch)?;
        d.set_item("n_layer", c.n_layer)?;
        d.set_item("n_embd", c.n_embd)?;
        d.set_item("n_ff", c.n_ff)?;
        d.set_item("n_head", c.n_head)?;
        d.set_item("n_head_kv", c.n_head_kv)?;
        d.set_item("dim_k", c.dim_k)?;
        // What each stored value row holds: none when values are read from
        // the key rows (MLA), whose first `kv_value_width` elements they are.
        d.set_item("dim_v", c.kv_shape().stored_dim_v())?;
        d.set_item("kv_v_in_k", c.kv_v_in_k)?;
        d.set_item("kv_value_width", c.dim_v)?;
        d.set_item("n_vocab", c.n_vocab)?;
        d.set_item("n_ctx_train", c.n_ctx_train)?;
        d.set_item(
            "norm",
            match c.norm {
                crate::model::config::NormKind::Rms => "rms",
                crate::model::config::NormKind::Layer => "layer",
            },
        )?;
        d.set_item("norm_eps", c.norm_eps)?;
        d.set_item("rope_base", c.rope_base)?;
        d.set_item("rope_dims", c.rope_dims)?;
        d.set_item("sliding_window", c.sliding_window)?;
        d.set_item("recurrent", c.ssm.is_some())?;
        // A hybrid keeps keys and values for its attention layers too.
        d.set_item("hybrid", c.is_hybrid())?;
        d.set_item("kv_layers", c.kv_layers())?;
        let recr: Vec<usize> = (0..c.n_layer).filter(|&il| c.is_recr_layer(il)).collect();
        let n_recr = recr.len();
        d.set_item("recurrent_layers", recr)?;
        if let Some(ssm) = &c.ssm {
            let r = PyDict::new(py);
            r.set_item("d_conv", ssm.d_conv)?;
            r.set_item("d_inner", ssm.d_inner)?;
            r.set_item("d_state", ssm.d_state)?;
            r.set_item("n_group", ssm.n_group)?;
            r.set_item("n_head", ssm.n_head)?;
            // Only the recurrent layers keep a state.
            r.set_item("state_bytes", (ssm.conv_len() + ssm.ssm_len()) * 4 * n_recr)?;
            d.set_item("ssm", r)?;
        }
        Ok(d)
    }
}

/// Pages of KV memory (16 positions each) shared by the sessions of one
/// model (the batching scheduler's memory budget).
#[pyclass(name = "KvPool", module = "oxillama._native", frozen)]
pub struct PyKvPool {
    inner: Arc<KvPool>,
}

#[pymethods]
impl PyKvPool {
    #[new]
    #[pyo3(signature = (model, n_pages, kv_dtype="f16"))]
    fn new(model: &PyModel, n_pages: usize, kv_dtype: &str) -> PyResult<Self> {
        let dtype = KvTypes::parse(kv_dtype).py_err()?;
        let c = &model.inner.cfg;
        let pool = guard(|| KvPool::for_shape(dtype, c.kv_shape(), n_pages).py_err())?;
        Ok(PyKvPool {
            inner: Arc::new(pool),
        })
    }

    #[getter]
    fn n_pages(&self) -> usize {
        self.inner.n_pages
    }

    #[getter]
    fn free_pages(&self) -> usize {
        self.inner.free_pages()
    }

    /// Positions per page.
    #[getter]
    fn page_size(&self) -> usize {
        PAGE
    }

    /// Bytes of page memory.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.bytes()
    }

    /// Hadamard block sizes the keys and values are stored under (0: none).
    #[getter]
    fn kv_rot(&self) -> (usize, usize) {
        (self.inner.rot.k, self.inner.rot.v)
    }
}

#[pyclass(name = "Session", module = "oxillama._native")]
pub struct PySession {
    inner: Session,
    poison: Poison,
}

#[pymethods]
impl PySession {
    #[new]
    #[pyo3(signature = (model, n_ctx, threads=None, kv_dtype="f16", pool=None))]
    fn new(
        model: &PyModel,
        n_ctx: usize,
        threads: Option<usize>,
        kv_dtype: &str,
        pool: Option<&PyKvPool>,
    ) -> PyResult<Self> {
        let dtype = KvTypes::parse(kv_dtype).py_err()?;
        let threads = threads.unwrap_or_else(physical_cores);
        if threads == 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "threads must be at least 1",
            ));
        }
        let model = Arc::clone(&model.inner);
        let s = guard(|| {
            match pool {
                None => Session::new(model, n_ctx, threads, dtype),
                Some(p) if p.inner.dtype != dtype => Err(crate::Error::invalid(format!(
                    "the KV pool holds {} but the session asks for {}",
                    p.inner.dtype.name(),
                    dtype.name()
                ))),
                Some(p) => Session::with_pool(model, n_ctx, threads, Arc::clone(&p.inner)),
            }
            .py_err()
        })?;
        Ok(PySession {
            inner: s,
            poison: Poison::default(),
        })
    }

    /// Activates LoRA adapters with their scales, replacing the previous
    /// set (an empty list turns them off). Each must have been loaded for
    /// this session's model.
    fn set_loras(&mut self, loras: Vec<(Bound<'_, PyLoraAdapter>, f32)>) -> PyResult<()> {
        let active = loras
            .iter()
            .map(|(a, s)| ActiveLora {
                adapter: Arc::clone(&a.get().inner),
                scale: *s,
            })
            .collect();
        let session = &mut self.inner;
        self.poison.run(|| session.set_loras(active).py_err())
    }

    /// Number of active LoRA adapters.
    #[getter]
    fn n_loras(&self) -> usize {
        self.inner.loras().len()
    }

    /// Pages of its pool that appending `n` tokens would take now (new
    /// pages, and copies of pages shared with a fork).
    fn pages_needed(&self, n: usize) -> PyResult<usize> {
        self.poison.run(|| {
            let past = self.inner.n_past();
            Ok(self.inner.kv.pages_needed(past, past.saturating_add(n)))
        })
    }

    /// KV pages (16 positions each) this session holds.
    #[getter]
    fn pages_held(&self) -> usize {
        self.inner.kv.pages_held()
    }

    /// Free pages of the pool this session draws from (shared pages are
    /// counted once: a fork takes none until it writes).
    #[getter]
    fn pool_free_pages(&self) -> usize {
        self.inner.kv.pool().free_pages()
    }

    /// Whether this session's pages come from `pool` (an engine's own
    /// session has a private pool of its own).
    fn in_pool(&self, pool: &PyKvPool) -> bool {
        Arc::ptr_eq(self.inner.kv.pool(), &pool.inner)
    }

    /// A new session on the same pool whose first `n` positions are this
    /// one's, sharing (not copying) their pages; either side's first write
    /// into a shared page copies that page.
    fn fork(&self, n: usize) -> PyResult<PySession> {
        self.poison.run(|| {
            let inner = self.inner.fork(n).py_err()?;
            Ok(PySession {
                inner,
                poison: Poison::default(),
            })
        })
    }

    /// Appends tokens; returns last-position logits `(vocab,)`, or
    /// `(len, vocab)` with `all_logits`. The GIL is released meanwhile.
    #[pyo3(signature = (tokens, all_logits=false))]
    fn eval<'py>(
        &mut self,
        py: Python<'py>,
        tokens: PyReadonlyArray1<'py, u32>,
        all_logits: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let toks = tokens.as_slice()?.to_vec();
        let n_vocab = self.inner.model.n_vocab();
        let session = &mut self.inner;
        let logits = self
            .poison
            .run(|| py.detach(|| session.eval(&toks, all_logits)).py_err())?;
        if all_logits {
            let rows = toks.len();
            let arr = PyArray1::from_vec(py, logits).reshape([rows, n_vocab])?;
            Ok(arr.into_any())
        } else {
            Ok(PyArray1::from_vec(py, logits).into_any())
        }
    }

    /// Whether multi-token evals attend row by row, giving logits
    /// bit-identical to one-token evals (speculative verification).
    #[getter]
    fn exact_rows(&self) -> bool {
        self.inner.exact_rows
    }
    #[setter]
    fn set_exact_rows(&mut self, v: bool) {
        self.inner.exact_rows = v;
    }

    /// The last position's normalized hidden state, or None when it is not
    /// current (empty context, after truncate or import).
    fn last_hidden<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyArray1<f32>>>> {
        self.poison.run(|| {
            Ok(self
                .inner
                .last_hidden()
                .map(|h| PyArray1::from_slice(py, h)))
        })
    }

    /// Output-head logits of a `last_hidden()` state, bit-identical to the
    /// logits `eval` returned with it.
    fn head_logits<'py>(
        &mut self,
        py: Python<'py>,
        hidden: PyReadonlyArray1<'py, f32>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let h = hidden.as_slice()?.to_vec();
        let session = &mut self.inner;
        let logits = self
            .poison
            .run(|| py.detach(|| session.head_logits(&h)).py_err())?;
        Ok(PyArray1::from_vec(py, logits))
    }

    /// Frees the activations of the last forward pass (megabytes for a
    /// prefill chunk), keeping `last_hidden()`; for sessions that wait.
    fn release_scratch(&mut self) -> PyResult<()> {
        let session = &mut self.inner;
        self.poison.run(|| {
            session.release_scratch();
            Ok(())
        })
    }

    /// Whether the last logits are `head_logits(last_hidden())` by
    /// construction (the head applied to that row, alone or in a batch).
    #[getter]
    fn logits_from_head(&self) -> bool {
        self.inner.logits_from_head()
    }

    fn truncate(&mut self, n: usize) -> PyResult<()> {
        let session = &mut self.inner;
        self.poison.run(|| session.truncate(n).py_err())
    }

    /// Context shift: keeps the first `keep` tokens, drops the `discard`
    /// after them and moves the rest down, re-rotating their cached keys
    /// (llama.cpp's seq_rm + seq_add). Refused (ParameterError) by
    /// recurrent and non-causal architectures.
    fn shift(&mut self, py: Python<'_>, keep: usize, discard: usize) -> PyResult<()> {
        let session = &mut self.inner;
        self.poison
            .run(|| py.detach(|| session.shift(keep, discard)).py_err())
    }

    /// Whether `truncate(n)` can succeed: always up to `n_past` for an
    /// attention model; a recurrent model only returns to positions it kept
    /// its state at.
    fn can_truncate(&self, n: usize) -> bool {
        self.inner.can_truncate(n)
    }

    fn reset(&mut self) -> PyResult<()> {
        let session = &mut self.inner;
        self.poison.run(|| {
            session.reset();
            Ok(())
        })
    }

    #[getter]
    fn n_past(&self) -> usize {
        self.inner.n_past()
    }
    #[getter]
    fn n_ctx(&self) -> usize {
        self.inner.n_ctx()
    }
    #[getter]
    fn threads(&self) -> usize {
        self.inner.threads()
    }
    #[getter]
    fn threads_in_use(&self) -> usize {
        self.inner.threads_in_use()
    }
    /// `(dispatches, dispatch_secs, work_secs, threads)` of this session's
    /// thread pool, counted while `count_pool_work(True)` is in effect
    /// (see `oxillama bench --pool-stats`).
    fn pool_stats(&self) -> (u64, f64, f64, usize) {
        let st = self.inner.pool_stats();
        (st.dispatches, st.dispatch_secs, st.work_secs, st.threads)
    }
    #[setter]
    fn set_threads(&mut self, n: usize) -> PyResult<()> {
        if n == 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "threads must be at least 1",
            ));
        }
        self.inner.set_threads(n);
        Ok(())
    }
    #[getter]
    fn prefill_chunk(&self) -> usize {
        self.inner.prefill_chunk
    }
    #[setter]
    fn set_prefill_chunk(&mut self, n: usize) -> PyResult<()> {
        if n == 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "prefill_chunk must be at least 1",
            ));
        }
        self.inner.prefill_chunk = n;
        Ok(())
    }
    /// The KV cache up to `n_past`, raw little-endian in `kv_dtype`.
    fn export_kv<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let session = &self.inner;
        let data = self
            .poison
            .run(|| py.detach(|| session.export_kv()).py_err())?;
        Ok(PyBytes::new(py, &data))
    }

    /// Size in bytes of `export_kv()`.
    fn export_kv_len(&self) -> usize {
        self.inner.export_kv_len()
    }

    /// Writes `export_kv()` into a writable buffer of exactly
    /// `export_kv_len()` bytes (no intermediate copy).
    fn export_kv_into(&self, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let session = &self.inner;
        self.poison
            .run(|| with_bytes_mut(out, |o| session.export_kv_into(o))?.py_err())
    }

    /// Loads `n` positions exported by `export_kv` (same model and dtype).
    fn import_kv(&mut self, n: usize, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let session = &mut self.inner;
        self.poison
            .run(|| with_bytes(data, |d| session.import_kv(n, d))?.py_err())
    }

    /// Keeps the first `start` positions and appends `blocks`, each a
    /// `(positions, bytes)` export of that many positions (the prefix
    /// store's blocks), read where they lie. On error the session is
    /// unchanged.
    fn import_kv_at(
        &mut self,
        py: Python<'_>,
        start: usize,
        blocks: Vec<(usize, Bound<'_, PyAny>)>,
    ) -> PyResult<()> {
        // The exports keep every buffer allocated and unresized; read-only
        // ones (the store's bytes and file mappings) cannot be written by
        // Python code either, so the GIL is released for them only.
        let mut held = Vec::with_capacity(blocks.len());
        for (p, b) in &blocks {
            let Ok(export) = super::buffer::Export::get(b, false) else {
                return Err(crate::Error::invalid(
                    "import_kv_at needs contiguous buffers",
                ))
                .py_err();
            };
            held.push((*p, export));
        }
        let detach = held.iter().all(|(_, e)| e.readonly());
        let views: Vec<(usize, &[u8])> = held.iter().map(|(p, e)| (*p, e.bytes())).collect();
        let session = &mut self.inner;
        self.poison.run(|| {
            if detach {
                py.detach(|| session.import_kv_at(start, &views)).py_err()
            } else {
                session.import_kv_at(start, &views).py_err()
            }
        })
    }

    #[getter]
    fn kv_dtype(&self) -> String {
        self.inner.kv.dtype.name()
    }

    /// Hadamard block sizes the cached keys and values are stored under
    /// (0: none): llama.cpp's default for quantized sides, unless
    /// `OXILLAMA_ATTN_ROT_DISABLE` was set when the cache was made.
    #[getter]
    fn kv_rot(&self) -> (usize, usize) {
        let r = self.inner.kv.rot();
        (r.k, r.v)
    }
}

/// Exported KV data (`Session.export_kv`) of `n` positions in types
/// `from_dtype` with rows under rotation `from_rot` (Hadamard block sizes of
/// keys and values, 0 for none), re-encoded row by row into `to_dtype`
/// under `to_rot`.
#[pyfunction]
#[pyo3(signature = (data, n_layer, n_head_kv, dim_k, dim_v, n, from_dtype, to_dtype, from_rot=(0, 0), to_rot=(0, 0)))]
#[allow(clippy::too_many_arguments)]
fn convert_kv<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    n_layer: usize,
    n_head_kv: usize,
    dim_k: usize,
    dim_v: usize,
    n: usize,
    from_dtype: &str,
    to_dtype: &str,
    from_rot: (usize, usize),
    to_rot: (usize, usize),
) -> PyResult<Bound<'py, PyBytes>> {
    let (from, to) = (
        KvTypes::parse(from_dtype).py_err()?,
        KvTypes::parse(to_dtype).py_err()?,
    );
    let shape = KvShape {
        n_layer,
        n_head_kv,
        dim_k,
        dim_v,
        v_in_k: false,
    };
    let rot = |(k, v): (usize, usize)| KvRot { k, v };
    let (ra, rb) = (rot(from_rot), rot(to_rot));
    let out = with_bytes(data, |d| {
        convert_export_rot(d, shape, n, (from, ra), (to, rb))
    })?
    .py_err()?;
    Ok(PyBytes::new(py, &out))
}

/// One KV row stored as `kv_dtype` (little-endian floats, or ggml blocks).
#[pyfunction]
fn kv_encode_row<'py>(
    py: Python<'py>,
    kv_dtype: &str,
    row: Vec<f32>,
) -> PyResult<Bound<'py, PyBytes>> {
    let t = KvTypes::parse(kv_dtype).py_err()?;
    let shape = KvShape {
        n_layer: 1,
        n_head_kv: 1,
        dim_k: row.len(),
        dim_v: row.len(),
        v_in_k: false,
    };
    let f32s = KvTypes::same(crate::model::KvDtype::F32);
    let data: Vec<u8> = row
        .iter()
        .chain(&row)
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let out = convert_export(&data, shape, 1, f32s, t).py_err()?;
    Ok(PyBytes::new(py, &out[..t.k.row_bytes(row.len())]))
}

#[pyfunction]
fn physical_core_count() -> usize {
    physical_cores()
}

/// Turns the thread pools' counters (`Session.pool_stats`) on or off; they
/// cost a decode step up to 1% while on.
#[pyfunction]
fn count_pool_work(on: bool) {
    crate::threadpool::set_counting(on);
}

/// BLAKE3 digest (32 bytes) of a bytes-like object, computed without the GIL.
#[pyfunction(name = "blake3")]
fn blake3_digest<'py>(py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let h = guard(|| with_bytes(data, crate::hash::hash))?;
    Ok(PyBytes::new(py, h.as_bytes()))
}

/// The snapshot checksum (16 bytes, `crate::checksum`) of a bytes-like
/// object, computed on the shared pool without the GIL.
#[pyfunction]
fn checksum<'py>(py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let d = guard(|| with_bytes(data, crate::checksum::digest))?;
    Ok(PyBytes::new(py, &d))
}

/// Writes `data` at byte `offset` of the open file `fd` while computing its
/// checksum (as `checksum`), which it returns. The GIL is released for
/// both, so the caller must own `data` exclusively for the call (the
/// snapshot writer passes its private image buffer).
#[pyfunction]
fn write_checksummed<'py>(
    py: Python<'py>,
    fd: i32,
    data: &Bound<'py, PyAny>,
    offset: u64,
) -> PyResult<Bound<'py, PyBytes>> {
    use std::os::fd::FromRawFd;
    if fd < 0 {
        return Err(crate::Error::invalid(format!(
            "write_checksummed: bad file descriptor {fd}"
        )))
        .py_err();
    }
    // The export keeps the memory allocated and unresized for this whole
    // call; the caller's contract (above) is that no thread writes it while
    // we read it with the GIL released.
    let Ok(export) = super::buffer::Export::get(data, false) else {
        return Err(crate::Error::invalid(
            "write_checksummed needs a contiguous buffer",
        ))
        .py_err();
    };
    let bytes = export.bytes();
    // SAFETY: `fd` is non-negative and open in the caller, which keeps it
    // open for the call; ManuallyDrop keeps us from closing it.
    let file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    let digest =
        guard(|| Ok(py.detach(|| crate::hashed_write::write_checksumming(&file, bytes, offset))?))?;
    Ok(PyBytes::new(py, &digest))
}

/// One forward pass that appends `tokens[i]` to `sessions[i]` for every
/// session (all on one model); returns the last new token's logits of each
/// (every new token's for a session whose `all_logits[i]` is true), session
/// after session, as a `(rows, n_vocab)` array. The GIL is released for the
/// pass.
#[pyfunction]
#[pyo3(signature = (sessions, tokens, all_logits=None))]
fn eval_batch<'py>(
    py: Python<'py>,
    sessions: Vec<Bound<'py, PySession>>,
    tokens: Vec<Vec<u32>>,
    all_logits: Option<Vec<bool>>,
) -> PyResult<Bound<'py, PyAny>> {
    let all_rows = all_logits.unwrap_or_default();
    let mut refs = Vec::with_capacity(sessions.len());
    for s in &sessions {
        let r = s
            .try_borrow_mut()
            .map_err(|_| {
                crate::Error::invalid("eval_batch got the same session twice (or one in use)")
            })
            .py_err()?;
        r.poison.check()?;
        refs.push(r);
    }
    let rows: usize = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if all_rows.get(i).copied().unwrap_or(false) {
                t.len()
            } else {
                1
            }
        })
        .sum();
    let n_vocab = refs.first().map_or(0, |r| r.inner.model.n_vocab());
    let mut inner: Vec<&mut Session> = refs.iter_mut().map(|r| &mut r.inner).collect();
    let batch = Poison::default();
    let logits = batch.run(|| {
        py.detach(|| Session::eval_batch(&mut inner, &tokens, &all_rows))
            .py_err()
    });
    if let (Err(e), Err(_)) = (&logits, batch.check()) {
        // The pass panicked while writing every session's KV cache.
        for r in &refs {
            r.poison.set(e);
        }
    }
    let logits = logits?;
    Ok(PyArray1::from_vec(py, logits)
        .reshape([rows, n_vocab])?
        .into_any())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(eval_batch, m)?)?;
    m.add_class::<PyModel>()?;
    m.add_class::<PySession>()?;
    m.add_class::<PyKvPool>()?;
    m.add_class::<PyLoraAdapter>()?;
    m.add_function(wrap_pyfunction!(physical_core_count, m)?)?;
    m.add_function(wrap_pyfunction!(count_pool_work, m)?)?;
    m.add_function(wrap_pyfunction!(convert_kv, m)?)?;
    m.add_function(wrap_pyfunction!(kv_encode_row, m)?)?;
    m.add_function(wrap_pyfunction!(blake3_digest, m)?)?;
    m.add_function(wrap_pyfunction!(write_checksummed, m)?)?;
    m.add_function(wrap_pyfunction!(checksum, m)?)?;
    m.add_function(wrap_pyfunction!(super::buffer::filled_bytes, m)?)?;
    Ok(())
}
