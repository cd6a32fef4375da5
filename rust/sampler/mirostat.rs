//! Mirostat v2 (Basu et al.): keeps the surprise of sampled tokens near the
//! target `tau` (bits). Tokens whose surprise `-log2 p` exceeds the running
//! threshold `mu` are cut, one token is drawn from the renormalized rest,
//! and `mu -= eta * (surprise - tau)` with the drawn token's surprise under
//! that renormalized distribution.

use super::candidates::Candidates;
use super::rng::Rng;

/// Applies temperature, truncates at `mu`, draws. Returns (token, new mu).
pub fn sample(
    c: &mut Candidates,
    temperature: f32,
    mu: f32,
    tau: f32,
    eta: f32,
    rng: &mut Rng,
) -> Option<(u32, f32)> {
    c.softmax(temperature);
    // -log2(p) <= mu  <=>  p >= 2^-mu; compared once, not a log per token.
    c.retain_p_at_least((-mu).exp2());
    let (id, p) = c.draw(rng)?;
    Some((id, update(mu, p, tau, eta)))
}

/// The threshold after a token of (normalized, truncated) probability `p`.
pub fn update(mu: f32, p: f32, tau: f32, eta: f32) -> f32 {
    let surprise = -p.log2();
    mu - eta * (surprise - tau)
}

/// Temperature, then the cut at `mu`; `c` ends normalized.
pub fn truncate(c: &mut Candidates, temperature: f32, mu: f32) {
    c.softmax(temperature);
    c.retain_p_at_least((-mu).exp2());
    c.normalize();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::test_util::cands;

    #[test]
    fn mu_update_follows_the_rule() {
        let l = [(0.6f32).ln(), (0.3f32).ln(), (0.1f32).ln()];
        // mu = 1.0 keeps only the 0.6 token (surprise 0.737 bits), which
        // then has p = 1 (surprise 0): mu' = 1 - 0.1 * (0 - 5) = 1.5.
        let mut rng = Rng::new(3);
        let (tok, mu) = sample(&mut cands(&l), 1.0, 1.0, 5.0, 0.1, &mut rng).unwrap();
        assert_eq!(tok, 0);
        assert!((mu - 1.5).abs() < 1e-6);
        // mu = 2.0 keeps 0.6 and 0.3 (1.74 bits) but not 0.1 (3.32 bits):
        // renormalized 2/3 and 1/3.
        for seed in 0..20 {
            let mut rng = Rng::new(seed);
            let (tok, mu) = sample(&mut cands(&l), 1.0, 2.0, 3.0, 0.5, &mut rng).unwrap();
            let p: f32 = if tok == 0 { 2.0 / 3.0 } else { 1.0 / 3.0 };
            assert!(tok < 2);
            assert!((mu - (2.0 - 0.5 * (-p.log2() - 3.0))).abs() < 1e-5);
        }
    }
}
