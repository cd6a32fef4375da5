//! Min-p: keeps tokens at least `min_p` times as likely as the most likely.

use super::candidates::Candidates;

pub fn min_p(c: &mut Candidates, min_p: f32) {
    if min_p <= 0.0 {
        return;
    }
    c.normalize();
    let cut = min_p * c.max_p();
    c.retain_p_at_least(cut);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::test_util::{cands, ids};

    #[test]
    fn cuts_below_a_fraction_of_the_best() {
        let l = [(0.5f32).ln(), (0.3f32).ln(), (0.15f32).ln(), (0.05f32).ln()];
        let mut c = cands(&l);
        min_p(&mut c, 0.2); // cut at 0.1
        assert_eq!(ids(&c), vec![0, 1, 2]);
        let mut c = cands(&l);
        min_p(&mut c, 1.0);
        assert_eq!(ids(&c), vec![0]);
    }
}
