//! XTC ("exclude top choices"): with probability `probability`, removes
//! every token whose probability is at least `threshold` except the least
//! probable of them, steering away from the most predictable continuations
//! while keeping a viable one. Nothing happens when fewer than two tokens
//! clear the threshold.

use super::candidates::Candidates;
use super::rng::Rng;

pub fn xtc(c: &mut Candidates, threshold: f32, probability: f32, rng: &mut Rng) {
    // Above 0.5 at most one token can clear the threshold: nothing to do,
    // and no random number is consumed.
    if !active(threshold, probability) || c.len() < 2 {
        return;
    }
    if rng.next_f64() >= probability as f64 {
        return;
    }
    remove_top(c, threshold);
}

/// Whether XTC can change anything: above 0.5 at most one token can clear
/// the threshold.
pub fn active(threshold: f32, probability: f32) -> bool {
    probability > 0.0 && threshold <= 0.5
}

/// The removal itself, as when the coin says to fire.
pub fn remove_top(c: &mut Candidates, threshold: f32) {
    if c.len() < 2 {
        return;
    }
    c.normalize();
    let above = c.as_slice().iter().filter(|x| x.p >= threshold).count();
    if above >= 2 {
        c.sort_prefix(above);
        c.drop_front(above - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::test_util::{cands, ids};

    #[test]
    fn removes_all_but_the_weakest_top_choice_when_it_fires() {
        let l = [(0.3f32).ln(), (0.5f32).ln(), (0.15f32).ln(), (0.05f32).ln()];
        let mut rng = Rng::new(1);
        let mut c = cands(&l);
        xtc(&mut c, 0.2, 1.0, &mut rng); // .5 and .3 clear it: keep only .3
        assert_eq!(ids(&c), vec![0, 2, 3]);
        let mut c = cands(&l);
        xtc(&mut c, 0.1, 1.0, &mut rng); // .5 .3 .15 clear it: keep .15
        assert_eq!(ids(&c), vec![2, 3]);
        let mut c = cands(&l);
        xtc(&mut c, 0.4, 1.0, &mut rng); // only .5 clears it
        assert_eq!(c.len(), 4);
        let before = rng.state();
        let mut c = cands(&l);
        xtc(&mut c, 0.2, 0.0, &mut rng);
        assert_eq!(c.len(), 4);
        assert_eq!(rng.state(), before, "probability 0 draws nothing");
    }

    #[test]
    fn fires_with_the_configured_probability() {
        let l = [(0.3f32).ln(), (0.5f32).ln(), (0.15f32).ln(), (0.05f32).ln()];
        let mut rng = Rng::new(2);
        let fired = (0..4000)
            .filter(|_| {
                let mut c = cands(&l);
                xtc(&mut c, 0.2, 0.25, &mut rng);
                c.len() == 3
            })
            .count();
        assert!((fired as f64 / 4000.0 - 0.25).abs() < 0.03, "{fired}");
    }
}
