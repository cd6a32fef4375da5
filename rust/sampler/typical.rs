//! Locally typical sampling (Meister et al.): ranks tokens by how close
//! their surprise (-ln p) is to the entropy of the distribution and keeps
//! the closest until their mass exceeds `typical_p`.
//!
//! The ranking is sorted a growing prefix at a time (64, 256, ...), so a
//! small typical set never pays for sorting the whole vocabulary.

use std::cmp::Ordering;

use super::candidates::{entropy, Candidates};

/// Reused buffers: (distance from the entropy, position) and kept positions.
#[derive(Default)]
pub struct TypicalScratch {
    keyed: Vec<(f32, usize)>,
    keep: Vec<usize>,
}

fn by_distance(a: &(f32, usize), b: &(f32, usize)) -> Ordering {
    a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
}

pub fn typical(c: &mut Candidates, typical_p: f32, s: &mut TypicalScratch) {
    if typical_p >= 1.0 {
        return;
    }
    if c.len() < 2 {
        return;
    }
    c.normalize();
    let cs = c.as_slice();
    let h = entropy(cs);
    s.keyed.clear();
    s.keyed.extend(cs.iter().enumerate().map(|(i, x)| {
        let d = if x.p > 0.0 {
            (-x.p.ln() - h).abs()
        } else {
            f32::INFINITY
        };
        (d, i)
    }));
    let n = s.keyed.len();
    let (mut sorted, mut m) = (0, n.min(64));
    let mut cum = 0f64;
    let mut keep = n;
    'grow: loop {
        let tail = &mut s.keyed[sorted..];
        let want = m - sorted;
        if want < tail.len() {
            tail.select_nth_unstable_by(want - 1, by_distance);
        }
        tail[..want].sort_unstable_by(by_distance);
        for i in sorted..m {
            cum += cs[s.keyed[i].1].p as f64;
            if cum > typical_p as f64 {
                keep = i + 1;
                break 'grow;
            }
        }
        if m >= n {
            break;
        }
        sorted = m;
        m = m.saturating_mul(4).min(n);
    }
    s.keep.clear();
    s.keep.extend(s.keyed[..keep.max(1)].iter().map(|k| k.1));
    c.keep_positions(&mut s.keep);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::test_util::{cands, ids};

    #[test]
    fn keeps_tokens_whose_surprise_is_nearest_the_entropy() {
        // p = .4 .3 .2 .05 .05: entropy 1.349 nats; surprises .916 1.204
        // 1.609 2.996 2.996: distances .433 .145 .260 1.647 -> order 1, 2, 0.
        let l = [
            (0.4f32).ln(),
            (0.3f32).ln(),
            (0.2f32).ln(),
            (0.05f32).ln(),
            (0.05f32).ln(),
        ];
        let mut s = TypicalScratch::default();
        let mut c = cands(&l);
        typical(&mut c, 0.4, &mut s); // .3 + .2 = .5 > .4
        assert_eq!(ids(&c), vec![1, 2]);
        let mut c = cands(&l);
        typical(&mut c, 0.15, &mut s); // .3 > .15 already
        assert_eq!(ids(&c), vec![1]);
        let mut c = cands(&l);
        typical(&mut c, 1.0, &mut s);
        assert_eq!(c.len(), 5);
    }

    #[test]
    fn prefix_growth_matches_a_full_sort() {
        let mut rng = crate::sampler::rng::Rng::new(9);
        let l: Vec<f32> = (0..5000).map(|_| (rng.next_f64() * 6.0) as f32).collect();
        for p in [0.05f32, 0.3, 0.9, 0.999] {
            let mut c = cands(&l);
            c.normalize();
            let cs = c.as_slice().to_vec();
            let h = entropy(&cs);
            let mut order: Vec<usize> = (0..cs.len()).collect();
            let d = |i: usize| (-cs[i].p.ln() - h).abs();
            order.sort_by(|&a, &b| d(a).total_cmp(&d(b)).then(a.cmp(&b)));
            let mut cum = 0f64;
            let k = order
                .iter()
                .position(|&i| {
                    cum += cs[i].p as f64;
                    cum > p as f64
                })
                .map_or(order.len(), |i| i + 1);
            let mut want: Vec<u32> = order[..k].iter().map(|&i| i as u32).collect();
            want.sort_unstable();
            typical(&mut c, p, &mut TypicalScratch::default());
            assert_eq!(ids(&c), want, "p={p}");
        }
    }
}
