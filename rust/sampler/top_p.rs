//! Top-p (nucleus): the smallest set of most probable tokens whose mass
//! reaches `p`. The set is found by sorting a growing prefix rather than the
//! whole vocabulary: a peaked distribution, the usual case, reaches `p`
//! within the first few dozen tokens. Each round grows the prefix at least
//! fourfold, and at least by `missing mass / p of the last sorted token`
//! (no unsorted token is more probable), which is a lower bound on how many
//! more tokens the nucleus needs.

use super::candidates::Candidates;

pub fn top_p(c: &mut Candidates, p: f32) {
    if p >= 1.0 {
        return;
    }
    c.normalize();
    let n = c.len();
    let mut m = n.min(64);
    let mut cum = 0f64;
    let mut i = 0;
    loop {
        c.sort_prefix(m);
        while i < m {
            cum += c.as_slice()[i].p as f64;
            i += 1;
            if cum >= p as f64 {
                c.truncate(i);
                return;
            }
        }
        if m >= n {
            return;
        }
        let last_p = c.as_slice()[m - 1].p as f64;
        let need = if last_p > 0.0 {
            ((p as f64 - cum) / last_p).ceil().min(n as f64) as usize
        } else {
            n
        };
        m = m.saturating_mul(4).max(m.saturating_add(need)).min(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::test_util::{cands, ids};

    #[test]
    fn keeps_the_minimal_nucleus() {
        let l = [(0.15f32).ln(), (0.5f32).ln(), (0.05f32).ln(), (0.3f32).ln()];
        for (p, want) in [
            (0.45, vec![1]),
            (0.75, vec![1, 3]),
            (0.79, vec![1, 3]),
            (0.81, vec![0, 1, 3]),
        ] {
            let mut c = cands(&l);
            top_p(&mut c, p);
            assert_eq!(ids(&c), want, "p={p}");
        }
        // A flat distribution over many tokens needs several prefix rounds.
        let mut c = cands(&vec![0.0; 10_000]);
        top_p(&mut c, 0.50005);
        assert_eq!(ids(&c), (0..5001).collect::<Vec<_>>());
    }
}
