//! What speculative decoding needs from the chain: the final distribution
//! of one step without drawing from it, and a way to record the token that
//! was chosen (by an accept/reject rule the sampler does not see).
//!
//! The distribution is the one [`Sampler::sample_masked`] draws from, with
//! the same state (history, mirostat's mu). XTC's coin is the only draw
//! inside the chain; its two outcomes are weighed into one mixture,
//! `(1 - p) * kept + p * removed`, so no RNG is consumed here and a caller
//! that draws with its own seeded generator stays reproducible.

use super::edits::View;
use super::{mirostat, nothing_left, truncate, xtc, Sampler, XtcCoin};
use crate::{Error, Result};

impl Sampler {
    /// The probability of every vocabulary entry for the next token (zero
    /// outside the surviving set). Temperature 0 is the point mass at the
    /// argmax. Leaves the state unchanged.
    pub fn probs_masked(&mut self, logits: &[f32], allowed: Option<&[u64]>) -> Result<Vec<f32>> {
        self.check_inputs(logits, allowed)?;
        self.edit(logits);
        let mut out = vec![0f32; self.vocab_size];
        let Sampler {
            cfg,
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
        if cfg.temperature == 0.0 {
            let t = view.argmax().ok_or_else(nothing_left)?;
            if let Some(x) = out.get_mut(t as usize) {
                *x = 1.0;
            }
            return Ok(out);
        }
        let mut scatter = |c: &super::Candidates, w: f32| {
            for x in c.as_slice() {
                if let Some(o) = out.get_mut(x.id as usize) {
                    *o += w * x.p;
                }
            }
        };
        if cfg.mirostat == 2 {
            c.fill(&view, f32::NEG_INFINITY);
            if c.len() == 0 {
                return Err(nothing_left());
            }
            mirostat::truncate(c, cfg.temperature, *mu);
            scatter(c, 1.0);
            return Ok(out);
        }
        let fire = if xtc::active(cfg.xtc_threshold, cfg.xtc_probability) {
            cfg.xtc_probability.min(1.0)
        } else {
            0.0
        };
        truncate(cfg, &view, c, typical, XtcCoin::Tails)?;
        c.softmax(cfg.temperature);
        scatter(c, 1.0 - fire);
        if fire > 0.0 {
            truncate(cfg, &view, c, typical, XtcCoin::Heads)?;
            c.softmax(cfg.temperature);
            scatter(c, fire);
        }
        Ok(out)
    }

    /// Records `token` as chosen from the distribution of
    /// [`Sampler::probs_masked`], where it had probability `p`: the history
    /// takes it, and mirostat's mu moves as if the sampler had drawn it.
    /// Without `p` only the history changes (a token whose distribution
    /// was never computed, such as a prompt token).
    pub fn advance(&mut self, token: u32, p: Option<f32>) -> Result<()> {
        if token as usize >= self.vocab_size {
            return Err(Error::invalid(format!(
                "token {token} is outside the vocabulary of {}",
                self.vocab_size
            )));
        }
        if let Some(p) = p {
            if !(p > 0.0 && p.is_finite()) {
                return Err(Error::invalid(format!(
                    "p must be a positive probability, got {p}"
                )));
            }
            // Greedy never reaches mirostat's stage, so its mu never moves.
            if self.cfg.mirostat == 2 && self.cfg.temperature > 0.0 {
                self.mu =
                    mirostat::update(self.mu, p, self.cfg.mirostat_tau, self.cfg.mirostat_eta);
            }
        }
        self.accept(token);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Rng, SamplerConfig};
    use super::*;

    fn logits(n: usize, seed: u64) -> Vec<f32> {
        let mut r = Rng::new(seed);
        (0..n).map(|_| (r.next_f64() * 6.0 - 3.0) as f32).collect()
    }

    fn with_history(cfg: SamplerConfig, n: usize) -> Sampler {
        let mut s = Sampler::new(cfg, n).unwrap();
        for t in [1u32, 2, 3, 4, 1, 2, 3, 7, 7, 1, 2] {
            s.accept(t);
        }
        s
    }

    /// Sampling many times from the same state must follow `probs_masked`
    /// (sampling only moves the RNG and, with mirostat, mu: reset it).
    fn empirical_matches(cfg: SamplerConfig) {
        let n = 60;
        let l = logits(n, 11);
        let mut s = with_history(cfg, n);
        let p = s.probs_masked(&l, None).unwrap();
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-4);
        let st = s.state();
        let draws = 40_000;
        let mut counts = vec![0usize; n];
        for _ in 0..draws {
            let t = s.sample(&l).unwrap();
            counts[t as usize] += 1;
            let rng = s.state().rng;
            s.set_state(st.clone()).unwrap();
            s.rng = Rng::from_state(rng);
        }
        let tv: f64 = (0..n)
            .map(|i| (counts[i] as f64 / draws as f64 - p[i] as f64).abs())
            .sum::<f64>()
            / 2.0;
        assert!(tv < 0.02, "total variation {tv}");
        for i in 0..n {
            if p[i] == 0.0 {
                assert_eq!(counts[i], 0, "token {i} has no mass but was drawn");
            }
        }
    }

    #[test]
    fn the_distribution_is_what_sampling_draws_from() {
        let base = SamplerConfig {
            seed: 3,
            temperature: 0.8,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        };
        empirical_matches(SamplerConfig {
            repetition_penalty: 1.5,
            frequency_penalty: 0.3,
            presence_penalty: 0.2,
            dry_multiplier: 0.8,
            dry_allowed_length: 1,
            ..base.clone()
        });
        empirical_matches(SamplerConfig {
            xtc_probability: 0.5,
            xtc_threshold: 0.02,
            typical_p: 0.9,
            top_a: 0.05,
            eta_cutoff: 0.002,
            epsilon_cutoff: 0.001,
            top_k: 30,
            top_p: 0.95,
            ..base.clone()
        });
        empirical_matches(SamplerConfig {
            mirostat: 2,
            mirostat_tau: 4.0,
            ..base
        });
    }

    #[test]
    fn advance_moves_mu_as_sampling_does_and_greedy_is_a_point_mass() {
        let n = 80;
        let l = logits(n, 5);
        let cfg = SamplerConfig {
            seed: 8,
            mirostat: 2,
            mirostat_tau: 3.0,
            repetition_penalty: 1.3,
            ..Default::default()
        };
        let mut a = with_history(cfg.clone(), n);
        let mut b = with_history(cfg, n);
        for _ in 0..20 {
            let p = b.probs_masked(&l, None).unwrap();
            let t = a.sample(&l).unwrap();
            a.accept(t);
            b.advance(t, Some(p[t as usize])).unwrap();
            assert_eq!(a.state().mirostat_mu, b.state().mirostat_mu);
            assert_eq!(a.state().history, b.state().history);
        }
        let mut g = with_history(
            SamplerConfig {
                temperature: 0.0,
                mirostat: 2,
                dry_multiplier: 1.0,
                ..Default::default()
            },
            n,
        );
        let want = g.sample(&l).unwrap();
        let p = g.probs_masked(&l, None).unwrap();
        assert_eq!(p[want as usize], 1.0);
        assert_eq!(p.iter().sum::<f32>(), 1.0);
        let mu = g.state().mirostat_mu;
        g.advance(want, Some(1.0)).unwrap();
        assert_eq!(g.state().mirostat_mu, mu, "greedy never moves mu");
    }

    #[test]
    fn bad_tokens_and_probabilities_are_errors() {
        let mut s = Sampler::new(SamplerConfig::default(), 10).unwrap();
        assert!(s.advance(10, None).is_err());
        assert!(s.advance(3, Some(0.0)).is_err());
        assert!(s.advance(3, Some(f32::NAN)).is_err());
        assert!(s.probs_masked(&[0.0; 9], None).is_err());
        assert!(s.probs_masked(&[0.0; 10], Some(&[0])).is_err());
        assert!(s.state().history.is_empty());
    }
}
