//! The sampler chain. Order, and why:
//! 1. grammar mask, bans and logit bias — hard constraints and user intent
//!    apply before anything looks at the distribution;
//! 2. repetition penalty, then DRY — they reshape logits using history;
//! 3. temperature 0 stops here with the argmax (so penalties still count);
//! 4. mirostat v2, when on, replaces the truncation stages: temperature,
//!    then its own surprise-based cut;
//! 5. otherwise top-k (cheap, shrinks the set) → typical → top-p → min-p →
//!    top-a → eta/epsilon → XTC, then temperature, then a draw from the
//!    softmax with the seeded RNG.
//!
//! Every truncation keeps at least one candidate.

mod candidates;
pub mod config;
mod dry;
mod mirostat;
mod penalties;
pub mod rng;
mod truncate;

use std::collections::VecDeque;

use candidates::Candidates;
pub use config::SamplerConfig;
use dry::Dry;
pub use rng::Rng;

use crate::{Error, Result};

/// History kept for penalties beyond the configured windows.
const HISTORY_CAP: usize = 8192;

/// The live state a snapshot must carry to continue a session exactly.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerState {
    pub rng: u64,
    pub mirostat_mu: f32,
    pub history: Vec<u32>,
}

pub struct Sampler {
    cfg: SamplerConfig,
    vocab_size: usize,
    rng: Rng,
    mu: f32,
    history: VecDeque<u32>,
    cands: Candidates,
    work: Vec<f32>,
}

/// Index of a draw from the candidates' probabilities.
pub(crate) fn draw(c: &Candidates, rng: &mut Rng) -> usize {
    let total: f64 = c.c.iter().map(|x| x.p as f64).sum();
    let mut r = rng.next_f64() * total;
    for (i, x) in c.c.iter().enumerate() {
        r -= x.p as f64;
        if r < 0.0 {
            return i;
        }
    }
    c.c.len() - 1
}

impl Sampler {
    pub fn new(cfg: SamplerConfig, vocab_size: usize) -> Result<Self> {
        cfg.validate(vocab_size)?;
        Ok(Sampler {
            rng: Rng::new(cfg.seed),
            mu: 2.0 * cfg.mirostat_tau,
            history: VecDeque::new(),
            cands: Candidates::default(),
            work: Vec::new(),
            vocab_size,
            cfg,
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Records a token that entered the context (prompt or generated).
    pub fn accept(&mut self, token: u32) {
        if self.history.len() == HISTORY_CAP {
            self.history.pop_front();
        }
        self.history.push_back(token);
    }

    pub fn reset(&mut self) {
        self.rng = Rng::new(self.cfg.seed);
        self.mu = 2.0 * self.cfg.mirostat_tau;
        self.history.clear();
    }

    pub fn state(&self) -> SamplerState {
        SamplerState {
            rng: self.rng.state(),
            mirostat_mu: self.mu,
            history: self.history.iter().copied().collect(),
        }
    }

    pub fn set_state(&mut self, s: SamplerState) -> Result<()> {
        if let Some(&bad) = s.history.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(Error::invalid(format!(
                "sampler history holds token {bad} outside the vocabulary"
            )));
        }
        if !s.mirostat_mu.is_finite() {
            return Err(Error::invalid("sampler state mirostat_mu is not finite"));
        }
        self.rng = Rng::from_state(s.rng);
        self.mu = s.mirostat_mu;
        let skip = s.history.len().saturating_sub(HISTORY_CAP);
        self.history = s.history[skip..].iter().copied().collect();
        Ok(())
    }

    pub fn sample(&mut self, logits: &[f32]) -> Result<u32> {
        self.sample_masked(logits, None)
    }

    /// Samples the next token. `allowed` is an optional bitset over the
    /// vocabulary (bit i set = token i allowed), as grammars produce.
    pub fn sample_masked(&mut self, logits: &[f32], allowed: Option<&[u64]>) -> Result<u32> {
        if logits.len() != self.vocab_size {
            return Err(Error::invalid(format!(
                "logits have {} entries, the vocabulary {}",
                logits.len(),
                self.vocab_size
            )));
        }
        let cfg = &self.cfg;
        self.work.clear();
        self.work.extend_from_slice(logits);
        let w = &mut self.work;
        for l in w.iter_mut() {
            if l.is_nan() {
                *l = f32::NEG_INFINITY;
            }
        }
        if let Some(mask) = allowed {
            if mask.len() * 64 < self.vocab_size {
                return Err(Error::invalid(
                    "allowed-token mask is shorter than the vocabulary",
                ));
            }
            for (i, l) in w.iter_mut().enumerate() {
                if mask[i / 64] >> (i % 64) & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        penalties::ban(w, &cfg.banned_tokens);
        penalties::logit_bias(w, &cfg.logit_bias);
        let (a, b) = self.history.as_slices();
        let hist: Vec<u32> = if b.is_empty() {
            a.to_vec()
        } else {
            [a, b].concat()
        };
        penalties::repetition(
            w,
            &hist,
            cfg.repetition_penalty_window,
            cfg.repetition_penalty,
        );
        Dry {
            multiplier: cfg.dry_multiplier,
            base: cfg.dry_base,
            allowed_length: cfg.dry_allowed_length,
            last_n: cfg.dry_penalty_last_n,
            breakers: &cfg.dry_breakers,
        }
        .apply(w, &hist);

        if cfg.temperature == 0.0 {
            let mut best: Option<(usize, f32)> = None;
            for (i, &l) in w.iter().enumerate() {
                if l > f32::NEG_INFINITY && best.is_none_or(|(_, bl)| l > bl) {
                    best = Some((i, l));
                }
            }
            return best.map(|(i, _)| i as u32).ok_or_else(|| {
                Error::generate("every token is banned or masked: nothing can be sampled")
            });
        }

        let c = &mut self.cands;
        c.fill(w);
        if c.c.is_empty() {
            return Err(Error::generate(
                "every token is banned or masked: nothing can be sampled",
            ));
        }
        if cfg.mirostat == 2 {
            for x in &mut c.c {
                x.logit /= cfg.temperature;
            }
            let (tok, mu) = mirostat::sample(
                c,
                self.mu,
                cfg.mirostat_tau,
                cfg.mirostat_eta,
                &mut self.rng,
            );
            self.mu = mu;
            return Ok(tok);
        }
        truncate::top_k(c, cfg.top_k);
        truncate::typical(c, cfg.typical_p);
        truncate::top_p(c, cfg.top_p);
        truncate::min_p(c, cfg.min_p);
        truncate::top_a(c, cfg.top_a);
        truncate::eta_epsilon(c, cfg.eta_cutoff, cfg.epsilon_cutoff);
        if cfg.xtc_probability > 0.0 {
            let fire = self.rng.next_f64() < cfg.xtc_probability as f64;
            truncate::xtc(c, cfg.xtc_threshold, fire);
        }
        for x in &mut c.c {
            x.logit /= cfg.temperature;
        }
        c.softmax();
        let i = draw(c, &mut self.rng);
        Ok(c.c[i].id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(n: usize, seed: u64) -> Vec<f32> {
        let mut r = Rng::new(seed);
        (0..n).map(|_| (r.next_f64() * 8.0 - 4.0) as f32).collect()
    }

    #[test]
    fn greedy_is_argmax_and_seeded_sampling_reproduces() {
        let l = logits(1000, 1);
        let mut g = Sampler::new(
            SamplerConfig {
                temperature: 0.0,
                ..Default::default()
            },
            1000,
        )
        .unwrap();
        let am = l
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0 as u32;
        assert_eq!(g.sample(&l).unwrap(), am);
        let cfg = SamplerConfig {
            seed: 9,
            ..Default::default()
        };
        let mut a = Sampler::new(cfg.clone(), 1000).unwrap();
        let mut b = Sampler::new(cfg, 1000).unwrap();
        let xs: Vec<u32> = (0..50).map(|_| a.sample(&l).unwrap()).collect();
        assert_eq!(
            xs,
            (0..50).map(|_| b.sample(&l).unwrap()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn state_round_trip_continues_the_stream() {
        let l = logits(500, 2);
        let cfg = SamplerConfig {
            seed: 5,
            mirostat: 2,
            ..Default::default()
        };
        let mut a = Sampler::new(cfg.clone(), 500).unwrap();
        for _ in 0..20 {
            let t = a.sample(&l).unwrap();
            a.accept(t);
        }
        let st = a.state();
        let mut b = Sampler::new(cfg, 500).unwrap();
        b.set_state(st).unwrap();
        for _ in 0..10 {
            let (x, y) = (a.sample(&l).unwrap(), b.sample(&l).unwrap());
            assert_eq!(x, y);
            a.accept(x);
            b.accept(y);
        }
    }

    #[test]
    fn banned_and_masked_tokens_never_appear() {
        let mut l = vec![0f32; 64];
        l[3] = 10.0;
        let cfg = SamplerConfig {
            banned_tokens: vec![3],
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg, 64).unwrap();
        let mask = [!(1u64 << 5)];
        for _ in 0..500 {
            let t = s.sample_masked(&l, Some(&mask)).unwrap();
            assert!(t != 3 && t != 5);
        }
        let cfg = SamplerConfig {
            temperature: 0.0,
            banned_tokens: (0..64).collect(),
            ..Default::default()
        };
        assert!(Sampler::new(cfg, 64).unwrap().sample(&l).is_err());
    }

    #[test]
    fn validation_names_the_field() {
        for (cfg, field) in [
            (
                SamplerConfig {
                    temperature: -1.0,
                    ..Default::default()
                },
                "temperature",
            ),
            (
                SamplerConfig {
                    top_p: 1.5,
                    ..Default::default()
                },
                "top_p",
            ),
            (
                SamplerConfig {
                    mirostat: 1,
                    ..Default::default()
                },
                "mirostat",
            ),
            (
                SamplerConfig {
                    logit_bias: vec![(99, 1.0)],
                    ..Default::default()
                },
                "logit_bias",
            ),
        ] {
            let e = Sampler::new(cfg, 50).err().unwrap().to_string();
            assert!(e.starts_with(field), "{e}");
        }
    }
}
