//! `Sampler`: the live sampler chain, configured from a Python dict.

use numpy::PyReadonlyArray1;
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::errors::IntoPyResult;
use crate::sampler::{Sampler, SamplerConfig, SamplerState};

#[pyclass(name = "Sampler", module = "oxillama._native")]
pub struct PySampler {
    inner: Sampler,
}

fn field<'py, T: FromPyObjectOwned<'py>>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<T> {
    d.get_item(key)?
        .ok_or_else(|| PyKeyError::new_err(format!("sampler config is missing {key}")))?
        .extract::<T>()
        .map_err(|e| {
            PyValueError::new_err(format!(
                "sampler config field {key}: {}",
                Into::<PyErr>::into(e)
            ))
        })
}

fn config_from(d: &Bound<'_, PyDict>, breakers: Vec<Vec<u32>>) -> PyResult<SamplerConfig> {
    let bias: Vec<(u32, f32)> = field(d, "logit_bias")?;
    let last_n: i64 = field(d, "dry_penalty_last_n")?;
    Ok(SamplerConfig {
        temperature: field(d, "temperature")?,
        top_k: field(d, "top_k")?,
        top_p: field(d, "top_p")?,
        min_p: field(d, "min_p")?,
        repetition_penalty: field(d, "repetition_penalty")?,
        repetition_penalty_window: field(d, "repetition_penalty_window")?,
        seed: field(d, "seed")?,
        mirostat: field(d, "mirostat")?,
        mirostat_tau: field(d, "mirostat_tau")?,
        mirostat_eta: field(d, "mirostat_eta")?,
        logit_bias: bias,
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

#[pymethods]
impl PySampler {
    #[new]
    #[pyo3(signature = (config, vocab_size, dry_breakers=Vec::new()))]
    fn new(
        config: &Bound<'_, PyDict>,
        vocab_size: usize,
        dry_breakers: Vec<Vec<u32>>,
    ) -> PyResult<Self> {
        let cfg = config_from(config, dry_breakers)?;
        Ok(PySampler {
            inner: Sampler::new(cfg, vocab_size).py_err()?,
        })
    }

    /// Samples a token from float32 logits; `allowed` is an optional
    /// little-endian u64 bitset over the vocabulary.
    #[pyo3(signature = (logits, allowed=None))]
    fn sample(
        &mut self,
        py: Python<'_>,
        logits: PyReadonlyArray1<'_, f32>,
        allowed: Option<&[u8]>,
    ) -> PyResult<u32> {
        let l = logits.as_slice()?;
        let mask: Option<Vec<u64>> = allowed.map(|b| {
            b.chunks(8)
                .map(|c| {
                    let mut a = [0u8; 8];
                    a[..c.len()].copy_from_slice(c);
                    u64::from_le_bytes(a)
                })
                .collect()
        });
        let s = &mut self.inner;
        py.detach(|| s.sample_masked(l, mask.as_deref())).py_err()
    }

    fn accept(&mut self, token: u32) {
        self.inner.accept(token)
    }

    fn reset(&mut self) {
        self.inner.reset()
    }

    fn get_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.state();
        let d = PyDict::new(py);
        d.set_item("rng", s.rng)?;
        d.set_item("mirostat_mu", s.mirostat_mu)?;
        d.set_item("history", s.history)?;
        Ok(d)
    }

    fn set_state(&mut self, state: &Bound<'_, PyDict>) -> PyResult<()> {
        let st = SamplerState {
            rng: field(state, "rng")?,
            mirostat_mu: field(state, "mirostat_mu")?,
            history: field(state, "history")?,
        };
        self.inner.set_state(st).py_err()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySampler>()
}
