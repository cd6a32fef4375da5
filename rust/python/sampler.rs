//! `Sampler`: the live sampler chain, configured from a Python dict (the
//! output of `SamplerConfig.to_dict()`).

use std::collections::BTreeMap;

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::exceptions::{guard, IntoPyResult, Poison};
use crate::sampler::{Sampler, SamplerConfig, SamplerState};

/// `(logprob of token, [(id, logprob), ...] for the k most likely)` under
/// the distribution of 1-D float32 `logits`, most likely first.
#[pyfunction]
pub fn logprobs(
    py: Python<'_>,
    logits: PyReadonlyArray1<'_, f32>,
    token: i64,
    k: usize,
) -> PyResult<(f32, Vec<(u32, f32)>)> {
    let arr = logits.as_array();
    let owned: Vec<f32>;
    let row: &[f32] = match logits.as_slice() {
        Ok(s) => s,
        Err(_) => {
            owned = arr.iter().copied().collect();
            &owned
        }
    };
    let n = row.len();
    let t = usize::try_from(token)
        .ok()
        .filter(|&t| t < n)
        .ok_or_else(|| PyValueError::new_err(format!("token {token} is outside the {n} logits")))?;
    py.detach(|| crate::sampler::logprobs::logprobs(row, t, k))
        .ok_or_else(|| PyValueError::new_err("no logit is finite"))
}

#[pyclass(name = "Sampler", module = "oxillama._native")]
pub struct PySampler {
    inner: Sampler,
    /// Reused copies of the last call's logits and mask: the compute runs
    /// without the GIL, and Python code may write to the caller's array
    /// meanwhile, so it reads a private copy (a memcpy next to the sampler's
    /// own passes).
    logits: Vec<f32>,
    mask: Vec<u64>,
    poison: Poison,
}

fn field<'py, T: FromPyObjectOwned<'py>>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<T> {
    d.get_item(key)?
        .ok_or_else(|| PyKeyError::new_err(format!("missing key {key}")))?
        .extract::<T>()
        .map_err(|e| PyValueError::new_err(format!("{key}: {}", Into::<PyErr>::into(e))))
}

/// `logit_bias` as `to_dict()` writes it (a list of (id, bias) pairs) or
/// as a plain {id: bias} dict.
fn logit_bias(d: &Bound<'_, PyDict>) -> PyResult<Vec<(u32, f32)>> {
    let v = d
        .get_item("logit_bias")?
        .ok_or_else(|| PyKeyError::new_err("missing key logit_bias"))?;
    if let Ok(m) = v.cast::<PyDict>() {
        let m: BTreeMap<u32, f32> = m.extract().map_err(|e| {
            PyValueError::new_err(format!("logit_bias: {}", Into::<PyErr>::into(e)))
        })?;
        return Ok(m.into_iter().collect());
    }
    field(d, "logit_bias")
}

fn config_from(d: &Bound<'_, PyDict>, breakers: Vec<Vec<u32>>) -> PyResult<SamplerConfig> {
    let last_n: i64 = field(d, "dry_penalty_last_n")?;
    if last_n < -1 {
        return Err(PyValueError::new_err(format!(
            "dry_penalty_last_n must be >= -1 (-1 means the whole history), got {last_n}"
        )));
    }
    let top_k: i64 = field(d, "top_k")?;
    Ok(SamplerConfig {
        temperature: field(d, "temperature")?,
        // Beyond i32::MAX top-k keeps everything anyway.
        top_k: top_k.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32,
        top_p: field(d, "top_p")?,
        min_p: field(d, "min_p")?,
        repetition_penalty: field(d, "repetition_penalty")?,
        repetition_penalty_window: field(d, "repetition_penalty_window")?,
        frequency_penalty: field(d, "frequency_penalty")?,
        presence_penalty: field(d, "presence_penalty")?,
        seed: field(d, "seed")?,
        mirostat: field(d, "mirostat")?,
        mirostat_tau: field(d, "mirostat_tau")?,
        mirostat_eta: field(d, "mirostat_eta")?,
        logit_bias: logit_bias(d)?,
        banned_tokens: field(d, "banned_tokens")?,
        dry_multiplier: field(d, "dry_multiplier")?,
        dry_base: field(d, "dry_base")?,
        dry_allowed_length: field(d, "dry_allowed_length")?,
        dry_penalty_last_n: usize::try_from(last_n).ok(),
        dry_breakers: breakers,
        xtc_threshold: field(d, "xtc_threshold")?,
        xtc_probability: field(d, "xtc_probability")?,
        typical_p: field(d, "typical_p")?,
        top_a: field(d, "top_a")?,
        eta_cutoff: field(d, "eta_cutoff")?,
        epsilon_cutoff: field(d, "epsilon_cutoff")?,
    })
}

impl PySampler {
    fn token(&self, token: i64) -> PyResult<u32> {
        u32::try_from(token)
            .ok()
            .filter(|&t| (t as usize) < self.inner.vocab_size())
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "token {token} is outside the vocabulary of {}",
                    self.inner.vocab_size()
                ))
            })
    }

    /// Copies `logits` and the `allowed` bitset (bit `i % 8` of byte
    /// `i // 8`) into the private buffers the GIL-free compute reads.
    fn load(&mut self, logits: &PyReadonlyArray1<'_, f32>, allowed: Option<&[u8]>) -> PyResult<()> {
        self.poison.check()?;
        self.logits.clear();
        match logits.as_slice() {
            Ok(s) => self.logits.extend_from_slice(s),
            Err(_) => self.logits.extend(logits.as_array().iter().copied()),
        }
        if let Some(bytes) = allowed {
            let need = self.inner.vocab_size().div_ceil(8);
            if bytes.len() < need {
                return Err(PyValueError::new_err(format!(
                    "allowed has {} bytes, the vocabulary of {} needs {need}",
                    bytes.len(),
                    self.inner.vocab_size()
                )));
            }
            self.mask.clear();
            self.mask.extend(bytes.chunks(8).map(|c| {
                let mut a = [0u8; 8];
                a[..c.len()].copy_from_slice(c);
                u64::from_le_bytes(a)
            }));
        }
        Ok(())
    }
}

#[pymethods]
impl PySampler {
    /// `config` is `SamplerConfig.to_dict()`; `dry_breakers` are the DRY
    /// sequence breakers as token-id sequences.
    #[new]
    #[pyo3(signature = (config, vocab_size, dry_breakers=Vec::new()))]
    fn new(
        config: &Bound<'_, PyDict>,
        vocab_size: usize,
        dry_breakers: Vec<Vec<u32>>,
    ) -> PyResult<Self> {
        let cfg = config_from(config, dry_breakers)?;
        Ok(PySampler {
            inner: guard(|| Sampler::new(cfg, vocab_size).py_err())?,
            logits: Vec::new(),
            mask: Vec::new(),
            poison: Poison::default(),
        })
    }

    /// Samples a token from 1-D float32 logits; `allowed` is an optional
    /// bitset over the vocabulary (bit `i % 8` of byte `i // 8` set = token
    /// `i` allowed, i.e. `numpy.packbits(mask, bitorder="little")`).
    /// Does not record the token: call `accept`.
    #[pyo3(signature = (logits, allowed=None))]
    fn sample(
        &mut self,
        py: Python<'_>,
        logits: PyReadonlyArray1<'_, f32>,
        allowed: Option<&[u8]>,
    ) -> PyResult<u32> {
        self.load(&logits, allowed)?;
        let PySampler {
            inner,
            logits: buf,
            mask,
            poison,
        } = self;
        let (buf, mask) = (&buf[..], allowed.map(|_| &mask[..]));
        poison.run(|| py.detach(|| inner.sample_masked(buf, mask)).py_err())
    }

    /// The float32 probability of every token for the next step, as
    /// `sample` would draw it from the current state (XTC's random removal
    /// weighed in as a mixture; temperature 0 is a point mass at the
    /// argmax). Changes nothing: pair it with `advance`.
    #[pyo3(signature = (logits, allowed=None))]
    fn probs<'py>(
        &mut self,
        py: Python<'py>,
        logits: PyReadonlyArray1<'_, f32>,
        allowed: Option<&[u8]>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        self.load(&logits, allowed)?;
        let PySampler {
            inner,
            logits: buf,
            mask,
            poison,
        } = self;
        let (buf, mask) = (&buf[..], allowed.map(|_| &mask[..]));
        let out = poison.run(|| py.detach(|| inner.probs_masked(buf, mask)).py_err())?;
        Ok(PyArray1::from_vec(py, out))
    }

    /// Records `token` as the one chosen where `probs` gave it probability
    /// `p` (mirostat's mu moves with it); without `p`, only the history
    /// takes it, as with `accept`.
    #[pyo3(signature = (token, p=None))]
    fn advance(&mut self, token: i64, p: Option<f64>) -> PyResult<()> {
        let t = self.token(token)?;
        let inner = &mut self.inner;
        self.poison
            .run(|| inner.advance(t, p.map(|p| p as f32)).py_err())
    }
    /// Records a token that entered the context (prompt or generated).
    fn accept(&mut self, token: i64) -> PyResult<()> {
        let t = self.token(token)?;
        let inner = &mut self.inner;
        self.poison.run(|| {
            inner.accept(t);
            Ok(())
        })
    }

    /// Back to the freshly constructed state (RNG from the seed, no history).
    fn reset(&mut self) -> PyResult<()> {
        let inner = &mut self.inner;
        self.poison.run(|| {
            inner.reset();
            Ok(())
        })
    }

    /// {"rng": int, "mirostat_mu": float, "history": list[int]}.
    fn get_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.poison.run(|| Ok(self.inner.state()))?;
        let d = PyDict::new(py);
        d.set_item("rng", s.rng)?;
        d.set_item("mirostat_mu", s.mirostat_mu)?;
        d.set_item("history", s.history)?;
        Ok(d)
    }

    /// Restores a `get_state()` dict; the stream continues exactly.
    fn set_state(&mut self, state: &Bound<'_, PyDict>) -> PyResult<()> {
        let st = SamplerState {
            rng: field(state, "rng")?,
            mirostat_mu: field(state, "mirostat_mu")?,
            history: field(state, "history")?,
        };
        let inner = &mut self.inner;
        self.poison.run(|| inner.set_state(st).py_err())
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(logprobs, m)?)?;
    m.add_class::<PySampler>()
}
