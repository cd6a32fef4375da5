//! The sampler chain: from one step's logits to the next token.
//!
//! Order, and why:
//! 1. grammar mask, banned tokens (-inf) and logit bias: hard constraints
//!    and explicit user intent come before anything reads the distribution;
//! 2. repetition penalty over the last `window` accepted tokens, OpenAI's
//!    frequency and presence penalties over the same window, then DRY:
//!    both reshape logits from the history, so every later stage (greedy
//!    included) sees the penalized values;
//! 3. temperature 0 stops here with the argmax: one pass, no allocation,
//!    and the truncations below could never change an argmax anyway;
//! 4. with mirostat v2 on, temperature then its own surprise-based cut
//!    replace every truncation stage (they would fight its feedback loop);
//! 5. otherwise the truncations, cheapest and most selective first: top-k
//!    (streamed off the logits, so the vocabulary is never sorted) shrinks
//!    the set for everything after it; typical → top-p → min-p → top-a →
//!    eta/epsilon each renormalize over what survives; XTC comes last among
//!    them because it removes the *top* choices, which must already be a
//!    viable set; temperature is applied at the very end (as llama.cpp
//!    does), so the truncation thresholds mean the same at any temperature;
//!    then one draw from the softmax with the seeded RNG.
//!
//! Every truncation keeps at least one candidate (min_keep = 1).
//!
//! Logits are never copied: bias, bans and penalties are sparse edits
//! ([`edits`]), merged into the dense passes on the fly.

mod candidates;
pub mod config;
mod dry;
mod edits;
mod eta;
mod logit_bias;
pub mod logprobs;
mod min_p;
mod mirostat;
mod penalties;
pub mod rng;
mod speculate;
mod top_a;
mod top_k;
mod top_p;
mod typical;
mod xtc;

use std::collections::VecDeque;

use candidates::Candidates;
pub use config::SamplerConfig;
use dry::{Dry, DryScratch};
use edits::{Edits, View};
pub use rng::Rng;

use crate::{Error, Result};

/// The live state a snapshot must carry to continue a session exactly.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerState {
    pub rng: u64,
    pub mirostat_mu: f32,
    /// Accepted tokens, oldest first (at most `SamplerConfig::history_len`).
    pub history: Vec<u32>,
}

pub struct Sampler {
    cfg: SamplerConfig,
    vocab_size: usize,
    rng: Rng,
    mu: f32,
    history: VecDeque<u32>,
    history_len: usize,
    // Buffers reused across calls.
    edits: Edits,
    cands: Candidates,
    dry: DryScratch,
    distinct: Vec<u32>,
    typical: typical::TypicalScratch,
}

fn nothing_left() -> Error {
    Error::generate("every token is banned or masked: nothing can be sampled")
}

impl Sampler {
    pub fn new(cfg: SamplerConfig, vocab_size: usize) -> Result<Self> {
        cfg.validate(vocab_size)?;
        Ok(Sampler {
            rng: Rng::new(cfg.seed),
            mu: 2.0 * cfg.mirostat_tau,
            history: VecDeque::new(),
            history_len: cfg.history_len(),
            edits: Edits::new(vocab_size),
            cands: Candidates::default(),
            dry: DryScratch::default(),
            distinct: Vec::new(),
            typical: typical::TypicalScratch::default(),
            vocab_size,
            cfg,
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Records a token that entered the context (prompt or generated); the
    /// penalties look at these. Ids outside the vocabulary are ignored.
    pub fn accept(&mut self, token: u32) {
        if token as usize >= self.vocab_size || self.history_len == 0 {
            return;
        }
        if self.history.len() >= self.history_len {
            self.history.pop_front();
        }
        self.history.push_back(token);
    }

    /// Back to the state right after `new`: RNG from the seed, mu = 2 tau,
    /// no history.
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

    /// Restores a snapshot taken with [`Sampler::state`]. History beyond
    /// what this configuration keeps is dropped from the old end.
    pub fn set_state(&mut self, s: SamplerState) -> Result<()> {
        if let Some(&bad) = s.history.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(Error::invalid(format!(
                "history holds token {bad}, outside the vocabulary of {}",
                self.vocab_size
            )));
        }
        if !s.mirostat_mu.is_finite() {
            return Err(Error::invalid(format!(
                "mirostat_mu must be finite, got {}",
                s.mirostat_mu
            )));
        }
        self.rng = Rng::from_state(s.rng);
        self.mu = s.mirostat_mu;
        let skip = s.history.len().saturating_sub(self.history_len);
        self.history.clear();
        self.history.extend(&s.history[skip..]);
        Ok(())
    }

    /// Samples the next token. Does not record it: call [`Sampler::accept`].
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32> {
        self.sample_masked(logits, None)
    }

    /// Samples the next token among those allowed by `allowed`, a bitset
    /// over the vocabulary (bit `i % 64` of word `i / 64` set = token `i`
    /// allowed), as a grammar produces. NaN logits count as -inf.
    pub fn sample_masked(&mut self, logits: &[f32], allowed: Option<&[u64]>) -> Result<u32> {
        self.check_inputs(logits, allowed)?;
        self.edit(logits);
        let Sampler {
            cfg,
            rng,
            mu,
            edits,
            cands: c,
            typical,
            ..
        } = self;
        let view = View {
            raw: logits,
            allowed,
            edits,
        };

        // 3: greedy.
        if cfg.temperature == 0.0 {
            return view.argmax().ok_or_else(nothing_left);
        }

        // 4: mirostat v2.
        if cfg.mirostat == 2 {
            c.fill(&view, f32::NEG_INFINITY);
            let (tok, new_mu) = mirostat::sample(
                c,
                cfg.temperature,
                *mu,
                cfg.mirostat_tau,
                cfg.mirostat_eta,
                rng,
            )
            .ok_or_else(nothing_left)?;
            *mu = new_mu;
            return Ok(tok);
        }

        // 5: truncations, temperature, draw.
        truncate(cfg, &view, c, typical, XtcCoin::Draw(rng))?;
        c.softmax(cfg.temperature);
        c.draw(rng).map(|(t, _)| t).ok_or_else(nothing_left)
    }

    fn check_inputs(&self, logits: &[f32], allowed: Option<&[u64]>) -> Result<()> {
        if logits.len() != self.vocab_size {
            return Err(Error::invalid(format!(
                "logits have {} entries, the vocabulary {}",
                logits.len(),
                self.vocab_size
            )));
        }
        if let Some(mask) = allowed {
            if mask.len() < self.vocab_size.div_ceil(64) {
                return Err(Error::invalid(format!(
                    "allowed mask covers {} tokens, the vocabulary has {}",
                    mask.len() * 64,
                    self.vocab_size
                )));
            }
        }
        Ok(())
    }

    /// Steps 1-2: the sparse edits (bias, bans, penalties, DRY) of `raw`
    /// under the current history, into `self.edits`.
    fn edit(&mut self, raw: &[f32]) {
        let cfg = &self.cfg;
        let edits = &mut self.edits;
        edits.clear();
        logit_bias::logit_bias(edits, raw, &cfg.logit_bias);
        // After the bias, so a ban wins over any bias, however large.
        logit_bias::ban(edits, raw, &cfg.banned_tokens);
        let history = self.history.make_contiguous();
        penalties::repetition(
            edits,
            raw,
            history,
            cfg.repetition_penalty_window,
            cfg.repetition_penalty,
            &mut self.distinct,
        );
        let additive = penalties::Additive {
            frequency: cfg.frequency_penalty,
            presence: cfg.presence_penalty,
        };
        penalties::additive(
            edits,
            raw,
            history,
            cfg.repetition_penalty_window,
            additive,
            &mut self.distinct,
        );
        let dry = Dry {
            multiplier: cfg.dry_multiplier,
            base: cfg.dry_base,
            allowed_length: cfg.dry_allowed_length,
            last_n: cfg.dry_penalty_last_n,
            breakers: &cfg.dry_breakers,
        };
        if dry.enabled() {
            dry.apply(edits, raw, history, &mut self.dry);
        }
    }
}

/// How XTC's coin falls in [`truncate`]: drawn from the sampler's RNG, or
/// fixed, so a caller can weigh both outcomes into one distribution.
enum XtcCoin<'a> {
    Draw(&'a mut Rng),
    Heads,
    Tails,
}

/// Step 5 up to the softmax: the truncation stages narrow `c` to the
/// candidates the final draw chooses among.
fn truncate(
    cfg: &SamplerConfig,
    view: &View<'_>,
    c: &mut Candidates,
    typical_scratch: &mut typical::TypicalScratch,
    coin: XtcCoin<'_>,
) -> Result<()> {
    if cfg.top_k > 0 {
        top_k::collect(view, cfg.top_k as usize, c);
    } else if cfg.min_p > 0.0 && cfg.typical_p >= 1.0 && cfg.top_p >= 1.0 {
        // Min-p is the first cut: p >= min_p * p_max is exactly
        // logit >= max + ln(min_p), so the tokens it would drop are never
        // collected (min_p itself still runs, on the survivors, and
        // decides the boundary; the margin only absorbs rounding).
        let floor = view.max_logit().map_or(f32::NEG_INFINITY, |m| {
            m + cfg.min_p.ln() - 1e-4 * (1.0 + m.abs())
        });
        c.fill(view, floor);
    } else {
        c.fill(view, f32::NEG_INFINITY);
    }
    if c.len() == 0 {
        return Err(nothing_left());
    }
    typical::typical(c, cfg.typical_p, typical_scratch);
    top_p::top_p(c, cfg.top_p);
    min_p::min_p(c, cfg.min_p);
    top_a::top_a(c, cfg.top_a);
    eta::epsilon_cutoff(c, cfg.epsilon_cutoff);
    eta::eta_cutoff(c, cfg.eta_cutoff);
    match coin {
        XtcCoin::Draw(rng) => xtc::xtc(c, cfg.xtc_threshold, cfg.xtc_probability, rng),
        XtcCoin::Heads => xtc::remove_top(c, cfg.xtc_threshold),
        XtcCoin::Tails => {}
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::candidates::Candidates;

    pub fn cands(logits: &[f32]) -> Candidates {
        let mut c = Candidates::default();
        for (i, &l) in logits.iter().enumerate() {
            c.push(i as u32, l);
        }
        c
    }

    /// The surviving ids, ascending.
    pub fn ids(c: &Candidates) -> Vec<u32> {
        let mut v: Vec<u32> = c.as_slice().iter().map(|x| x.id).collect();
        v.sort_unstable();
        v
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

    fn plain() -> SamplerConfig {
        SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_sees_bias_bans_and_penalties() {
        let mut l = vec![0f32; 100];
        l[10] = 5.0;
        l[20] = 4.0;
        l[30] = 3.0;
        let greedy = |cfg: SamplerConfig| {
            Sampler::new(
                SamplerConfig {
                    temperature: 0.0,
                    ..cfg
                },
                100,
            )
            .unwrap()
        };
        assert_eq!(greedy(plain()).sample(&l).unwrap(), 10);
        let mut s = greedy(SamplerConfig {
            logit_bias: vec![(30, 2.5)],
            ..plain()
        });
        assert_eq!(s.sample(&l).unwrap(), 30);
        let mut s = greedy(SamplerConfig {
            banned_tokens: vec![10],
            ..plain()
        });
        assert_eq!(s.sample(&l).unwrap(), 20);
        let mut s = greedy(SamplerConfig {
            repetition_penalty: 2.0,
            ..plain()
        });
        s.accept(10);
        assert_eq!(s.sample(&l).unwrap(), 20); // 5 / 2 < 4
                                               // The DRY penalty is exactly multiplier * base^(len - allowed):
                                               // after "1 2 3 10 ... 1 2 3", 10 extends a 3-run: 0.5 * 3^(3-2) = 1.5.
        for (delta, want) in [(0.01f32, 10u32), (-0.01, 20)] {
            let mut s = greedy(SamplerConfig {
                dry_multiplier: 0.5,
                dry_base: 3.0,
                dry_allowed_length: 2,
                ..plain()
            });
            for t in [1, 2, 3, 10, 7, 1, 2, 3] {
                s.accept(t);
            }
            let mut l2 = l.clone();
            l2[10] = 4.0 + 1.5 + delta; // 4.0 + delta after the penalty
            assert_eq!(s.sample(&l2).unwrap(), want, "delta {delta}");
        }
    }

    #[test]
    fn default_chain_stays_within_top_k_and_handles_infinities() {
        let l = logits(5000, 4);
        let mut order: Vec<usize> = (0..l.len()).collect();
        order.sort_by(|&a, &b| l[b].total_cmp(&l[a]));
        let top: std::collections::HashSet<u32> = order[..40].iter().map(|&i| i as u32).collect();
        let mut s = Sampler::new(
            SamplerConfig {
                temperature: 3.0,
                min_p: 0.0,
                top_p: 1.0,
                ..Default::default()
            },
            5000,
        )
        .unwrap();
        let seen: std::collections::HashSet<u32> =
            (0..2000).map(|_| s.sample(&l).unwrap()).collect();
        assert!(seen.is_subset(&top));
        assert!(seen.len() > 30);
        let mut inf = vec![0f32; 8];
        inf[2] = f32::INFINITY;
        inf[5] = f32::INFINITY;
        inf[6] = f32::NAN;
        let mut s = Sampler::new(plain(), 8).unwrap();
        let seen: std::collections::HashSet<u32> =
            (0..200).map(|_| s.sample(&inf).unwrap()).collect();
        assert_eq!(seen, [2, 5].into_iter().collect());
    }

    #[test]
    fn bad_inputs_are_errors_not_panics() {
        let mut s = Sampler::new(plain(), 100).unwrap();
        assert!(matches!(
            s.sample(&[0.0; 99]),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            s.sample_masked(&[0.0; 100], Some(&[u64::MAX])),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            s.sample_masked(&[0.0; 100], Some(&[0, 0])),
            Err(Error::Generate(_))
        ));
        assert!(s.sample(&[f32::NAN; 100]).is_err());
        assert!(Sampler::new(plain(), 0).is_err());
        s.accept(100); // ignored
        assert!(s.state().history.is_empty());
        assert!(s
            .set_state(SamplerState {
                rng: 1,
                mirostat_mu: f32::NAN,
                history: vec![]
            })
            .is_err());
    }

    #[test]
    fn history_is_bounded_and_reset_restarts_the_stream() {
        let cfg = SamplerConfig {
            repetition_penalty_window: 5,
            dry_penalty_last_n: Some(3),
            ..plain()
        };
        let mut s = Sampler::new(cfg.clone(), 50).unwrap();
        for t in 0..20 {
            s.accept(t);
        }
        assert_eq!(s.state().history, vec![15, 16, 17, 18, 19]);
        let l = logits(50, 3);
        let first: Vec<u32> = (0..10).map(|_| s.sample(&l).unwrap()).collect();
        s.reset();
        assert!(s.state().history.is_empty());
        let mut fresh = Sampler::new(cfg, 50).unwrap();
        let again: Vec<u32> = (0..10).map(|_| s.sample(&l).unwrap()).collect();
        assert_eq!(
            again,
            (0..10)
                .map(|_| fresh.sample(&l).unwrap())
                .collect::<Vec<_>>()
        );
        assert_eq!(first, again);
    }

    #[test]
    fn every_stage_at_once_is_reproducible() {
        let cfg = SamplerConfig {
            seed: 77,
            typical_p: 0.9,
            top_a: 0.1,
            eta_cutoff: 0.001,
            epsilon_cutoff: 0.0001,
            xtc_probability: 0.5,
            repetition_penalty: 1.3,
            dry_multiplier: 0.8,
            dry_breakers: vec![vec![0]],
            logit_bias: vec![(3, 1.0)],
            banned_tokens: vec![4],
            ..Default::default()
        };
        let run = || {
            let mut s = Sampler::new(cfg.clone(), 3000).unwrap();
            let l = logits(3000, 8);
            (0..100)
                .map(|_| {
                    let t = s.sample(&l).unwrap();
                    s.accept(t);
                    t
                })
                .collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        assert!(!a.contains(&4));
    }
}
