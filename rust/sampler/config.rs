//! Sampler settings, validated once so the hot path need not check them.

use crate::{Error, Result};

/// Every stage's setting; each stage is off at its neutral value (top_k 0,
/// top_p 1, min_p 0, repetition_penalty 1, dry_multiplier 0, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub repetition_penalty_window: usize,
    /// OpenAI's frequency penalty over the same window (0 is off).
    pub frequency_penalty: f32,
    /// OpenAI's presence penalty over the same window (0 is off).
    pub presence_penalty: f32,
    pub seed: u64,
    /// 0 (off) or 2 (Mirostat v2).
    pub mirostat: u8,
    pub mirostat_tau: f32,
    pub mirostat_eta: f32,
    pub logit_bias: Vec<(u32, f32)>,
    pub banned_tokens: Vec<u32>,
    pub dry_multiplier: f32,
    pub dry_base: f32,
    pub dry_allowed_length: usize,
    /// Tokens of history DRY looks at; `None` means all of it.
    /// `Some(0)` disables DRY.
    pub dry_penalty_last_n: Option<usize>,
    /// Token sequences that break DRY matching (each tokenized breaker string).
    pub dry_breakers: Vec<Vec<u32>>,
    pub xtc_threshold: f32,
    pub xtc_probability: f32,
    pub typical_p: f32,
    pub top_a: f32,
    pub eta_cutoff: f32,
    pub epsilon_cutoff: f32,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            repetition_penalty_window: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
            mirostat: 0,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            logit_bias: Vec::new(),
            banned_tokens: Vec::new(),
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: None,
            dry_breakers: Vec::new(),
            xtc_threshold: 0.1,
            xtc_probability: 0.0,
            typical_p: 1.0,
            top_a: 0.0,
            eta_cutoff: 0.0,
            epsilon_cutoff: 0.0,
        }
    }
}

/// History kept when DRY looks at all of it (`dry_penalty_last_n = None`).
pub const DEFAULT_HISTORY: usize = 8192;

fn check(ok: bool, field: &str, rule: &str, got: impl std::fmt::Display) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!("{field} must be {rule}, got {got}")))
    }
}

impl SamplerConfig {
    /// How many accepted tokens the penalties can look at; the sampler keeps
    /// no more history than this.
    pub fn history_len(&self) -> usize {
        self.repetition_penalty_window
            .max(self.dry_penalty_last_n.unwrap_or(DEFAULT_HISTORY))
    }

    /// Checks every field; token ids must be below `vocab_size`. The error
    /// names the field: "temperature must be >= 0, got -1".
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        check(vocab_size > 0, "vocab_size", "> 0", vocab_size)?;
        check(
            u32::try_from(vocab_size).is_ok(),
            "vocab_size",
            "< 2^32",
            vocab_size,
        )?;
        let unit = |x: f32| (0.0..=1.0).contains(&x);
        check(
            self.temperature >= 0.0 && self.temperature.is_finite(),
            "temperature",
            ">= 0",
            self.temperature,
        )?;
        check(self.top_k >= 0, "top_k", ">= 0 (0 disables it)", self.top_k)?;
        check(
            self.top_p > 0.0 && self.top_p <= 1.0,
            "top_p",
            "in (0, 1]",
            self.top_p,
        )?;
        check(unit(self.min_p), "min_p", "in [0, 1]", self.min_p)?;
        check(
            self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite(),
            "repetition_penalty",
            "> 0",
            self.repetition_penalty,
        )?;
        // OpenAI's range; beyond it the penalties stop being a nudge.
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            check((-2.0..=2.0).contains(&v), name, "in [-2, 2]", v)?;
        }
        check(
            matches!(self.mirostat, 0 | 2),
            "mirostat",
            "0 or 2",
            self.mirostat,
        )?;
        check(
            self.mirostat_tau > 0.0 && self.mirostat_tau.is_finite(),
            "mirostat_tau",
            "> 0",
            self.mirostat_tau,
        )?;
        check(
            unit(self.mirostat_eta) && self.mirostat_eta > 0.0,
            "mirostat_eta",
            "in (0, 1]",
            self.mirostat_eta,
        )?;
        check(
            self.dry_multiplier >= 0.0 && self.dry_multiplier.is_finite(),
            "dry_multiplier",
            ">= 0",
            self.dry_multiplier,
        )?;
        check(
            self.dry_base >= 1.0 && self.dry_base.is_finite(),
            "dry_base",
            ">= 1",
            self.dry_base,
        )?;
        check(
            self.dry_allowed_length >= 1,
            "dry_allowed_length",
            ">= 1",
            self.dry_allowed_length,
        )?;
        check(
            unit(self.xtc_threshold),
            "xtc_threshold",
            "in [0, 1]",
            self.xtc_threshold,
        )?;
        check(
            unit(self.xtc_probability),
            "xtc_probability",
            "in [0, 1]",
            self.xtc_probability,
        )?;
        check(
            self.typical_p > 0.0 && self.typical_p <= 1.0,
            "typical_p",
            "in (0, 1]",
            self.typical_p,
        )?;
        check(unit(self.top_a), "top_a", "in [0, 1]", self.top_a)?;
        check(
            unit(self.eta_cutoff),
            "eta_cutoff",
            "in [0, 1]",
            self.eta_cutoff,
        )?;
        check(
            unit(self.epsilon_cutoff),
            "epsilon_cutoff",
            "in [0, 1]",
            self.epsilon_cutoff,
        )?;
        for &(id, b) in &self.logit_bias {
            check(
                (id as usize) < vocab_size,
                "logit_bias",
                &format!("keyed by token ids < {vocab_size}"),
                id,
            )?;
            check(!b.is_nan(), "logit_bias", "free of NaN", b)?;
        }
        for &id in &self.banned_tokens {
            check(
                (id as usize) < vocab_size,
                "banned_tokens",
                &format!("token ids < {vocab_size}"),
                id,
            )?;
        }
        for &id in self.dry_breakers.iter().flatten() {
            check(
                (id as usize) < vocab_size,
                "dry_breakers",
                &format!("token ids < {vocab_size}"),
                id,
            )?;
        }
        Ok(())
    }
}
