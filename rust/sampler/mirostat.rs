//! Mirostat v2: keeps the surprise of sampled tokens near `tau` by
//! truncating tokens whose surprise exceeds a running threshold `mu`.

use super::candidates::Candidates;
use super::rng::Rng;

/// Truncates at `mu`, samples, and returns the token with the updated `mu`.
pub fn sample(c: &mut Candidates, mu: f32, tau: f32, eta: f32, rng: &mut Rng) -> (u32, f32) {
    c.sort();
    c.softmax();
    let keep = c.c.iter().take_while(|x| -x.p.log2() <= mu).count().max(1);
    c.c.truncate(keep);
    c.softmax();
    let idx = super::draw(c, rng);
    let observed = -c.c[idx].p.log2();
    let new_mu = mu - eta * (observed - tau);
    (c.c[idx].id, new_mu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mu_update_follows_the_rule() {
        let l = [(0.6f32).ln(), (0.3f32).ln(), (0.1f32).ln()];
        let mut c = Candidates::default();
        c.fill(&l);
        let mut rng = Rng::new(3);
        // mu = 1.0 keeps only the 0.6 token (surprise 0.737 bits).
        let (tok, mu) = sample(&mut c, 1.0, 5.0, 0.1, &mut rng);
        assert_eq!(tok, 0);
        // After truncation the kept token has p = 1: surprise 0.
        assert!((mu - (1.0 - 0.1 * (0.0 - 5.0))).abs() < 1e-6);
    }
}
