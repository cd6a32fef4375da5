//! Epsilon cutoff (drop tokens with p < epsilon) and eta cutoff (the same
//! with an entropy-adaptive threshold `min(eta, sqrt(eta) * exp(-H))`),
//! after Hewitt et al., "Truncation Sampling as Language Model Desmoothing".

use super::candidates::{entropy, Candidates};

pub fn epsilon_cutoff(c: &mut Candidates, epsilon: f32) {
    if epsilon <= 0.0 {
        return;
    }
    c.normalize();
    c.retain_p_at_least(epsilon);
}

pub fn eta_cutoff(c: &mut Candidates, eta: f32) {
    if eta <= 0.0 {
        return;
    }
    c.normalize();
    let h = entropy(c.as_slice());
    c.retain_p_at_least(eta.min(eta.sqrt() * (-h).exp()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::test_util::{cands, ids};

    #[test]
    fn cut_by_absolute_and_entropy_scaled_thresholds() {
        let l = [(0.5f32).ln(), (0.3f32).ln(), (0.15f32).ln(), (0.05f32).ln()];
        let mut c = cands(&l);
        epsilon_cutoff(&mut c, 0.1);
        assert_eq!(ids(&c), vec![0, 1, 2]);
        let mut c = cands(&l);
        epsilon_cutoff(&mut c, 0.9);
        assert_eq!(ids(&c), vec![0]);
        // H = 1.1422 nats; eta 0.3 -> min(0.3, 0.5477 * 0.3191 = 0.1748)
        let mut c = cands(&l);
        eta_cutoff(&mut c, 0.3);
        assert_eq!(ids(&c), vec![0, 1]);
        // eta 0.049 -> min(0.049, 0.0706) = 0.049: 0.05 survives
        let mut c = cands(&l);
        eta_cutoff(&mut c, 0.049);
        assert_eq!(ids(&c), vec![0, 1, 2, 3]);
    }
}
