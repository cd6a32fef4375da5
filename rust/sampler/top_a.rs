//! Top-a: keeps tokens with `p >= a * p_max^2`, a cut that tightens
//! quadratically as the model grows confident.

use super::candidates::Candidates;

pub fn top_a(c: &mut Candidates, a: f32) {
    if a <= 0.0 {
        return;
    }
    c.normalize();
    let m = c.max_p();
    c.retain_p_at_least(a * m * m);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::test_util::{cands, ids};

    #[test]
    fn cuts_at_a_times_the_squared_maximum() {
        let l = [(0.5f32).ln(), (0.25f32).ln(), (0.15f32).ln(), (0.1f32).ln()];
        let mut c = cands(&l);
        top_a(&mut c, 0.5); // cut 0.125
        assert_eq!(ids(&c), vec![0, 1, 2]);
        let mut c = cands(&l);
        top_a(&mut c, 0.7); // cut 0.175
        assert_eq!(ids(&c), vec![0, 1]);
    }
}
