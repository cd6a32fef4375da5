//! DRY ("don't repeat yourself", p-e-w): penalizes the token that would
//! extend a sequence already present in the history. If the last `n` tokens
//! also occur earlier followed by token `t`, emitting `t` would repeat an
//! `n + 1`-token run, so when `n >= allowed_length` its logit drops by
//! `multiplier * base^(n - allowed_length)` (the largest `n` per token).
//!
//! Sequence breakers (pre-tokenized id sequences, e.g. a newline) stop
//! matching: the repeated suffix may not reach back past the last complete
//! breaker in the history, and a single-token breaker is never penalized
//! itself. All suffix-match lengths come from one Z-algorithm pass over the
//! reversed history, so the stage is linear in the history it looks at.

use super::edits::Edits;

/// ln(f32::MAX): the exponent is clamped so `base^exp` stays finite.
const LN_F32_MAX: f32 = 88.722_84;

pub struct Dry<'a> {
    pub multiplier: f32,
    pub base: f32,
    pub allowed_length: usize,
    /// Most recent tokens considered; `None` = the whole history.
    pub last_n: Option<usize>,
    pub breakers: &'a [Vec<u32>],
}

/// Buffers reused across calls.
#[derive(Default)]
pub struct DryScratch {
    z: Vec<usize>,
    hits: Vec<(u32, usize)>,
    out: Vec<(u32, f32)>,
}

impl Dry<'_> {
    pub fn enabled(&self) -> bool {
        self.multiplier > 0.0 && self.last_n != Some(0)
    }

    /// How many trailing tokens of `w` come after the last complete breaker.
    fn rep_limit(&self, w: &[u32]) -> usize {
        for end in (1..=w.len()).rev() {
            let hit = self
                .breakers
                .iter()
                .any(|b| !b.is_empty() && b.len() <= end && w[end - b.len()..end] == b[..]);
            if hit {
                return w.len() - end;
            }
        }
        w.len()
    }

    fn is_single_token_breaker(&self, t: u32) -> bool {
        self.breakers.iter().any(|b| b.len() == 1 && b[0] == t)
    }

    /// (token, penalty) pairs, one per penalized token, in `scratch.out`.
    pub fn penalties<'s>(&self, history: &[u32], scratch: &'s mut DryScratch) -> &'s [(u32, f32)] {
        scratch.out.clear();
        if !self.enabled() {
            return &scratch.out;
        }
        let start = self.last_n.map_or(0, |n| history.len().saturating_sub(n));
        let w = &history[start..];
        let m = w.len();
        if m <= self.allowed_length {
            return &scratch.out;
        }
        let limit = self.rep_limit(w);
        if limit < self.allowed_length {
            return &scratch.out;
        }
        // Z-algorithm on r = reversed w: z[k] = longest common prefix of r
        // and r[k..] = length of the longest suffix of w that also ends at
        // w[m - 1 - k].
        let r = |i: usize| w[m - 1 - i];
        let z = &mut scratch.z;
        z.clear();
        z.resize(m, 0);
        let (mut lo, mut hi) = (0usize, 0usize); // rightmost match box r[lo..hi]
        for k in 1..m {
            let mut len = if k < hi { (hi - k).min(z[k - lo]) } else { 0 };
            while k + len < m && r(len) == r(k + len) {
                len += 1;
            }
            z[k] = len;
            if k + len > hi {
                lo = k;
                hi = k + len;
            }
        }
        scratch.hits.clear();
        for k in 1..m {
            let n = z[k].min(limit);
            if n >= self.allowed_length {
                // The match ends at w[m - 1 - k]; the token after it would extend it.
                scratch.hits.push((w[m - k], n));
            }
        }
        scratch
            .hits
            .sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        scratch.hits.dedup_by_key(|h| h.0);
        let max_exp = if self.base > 1.000_001 {
            (LN_F32_MAX / self.base.ln()) as usize
        } else {
            usize::MAX
        };
        for &(t, n) in &scratch.hits {
            if self.is_single_token_breaker(t) {
                continue;
            }
            let e = (n - self.allowed_length)
                .min(max_exp)
                .min(i32::MAX as usize) as i32;
            scratch.out.push((t, self.multiplier * self.base.powi(e)));
        }
        &scratch.out
    }

    pub fn apply(&self, edits: &mut Edits, raw: &[f32], history: &[u32], scratch: &mut DryScratch) {
        for &(t, p) in self.penalties(history, scratch) {
            if let Some(l) = edits.get_mut(raw, t) {
                *l -= p;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dry(breakers: &[Vec<u32>]) -> Dry<'_> {
        Dry {
            multiplier: 1.0,
            base: 2.0,
            allowed_length: 2,
            last_n: None,
            breakers,
        }
    }

    fn pens(d: &Dry<'_>, h: &[u32]) -> Vec<(u32, f32)> {
        let mut s = DryScratch::default();
        let mut v = d.penalties(h, &mut s).to_vec();
        v.sort_by_key(|x| x.0);
        v
    }

    /// Brute force: for every earlier end position, the longest suffix of
    /// the history that also ends there (capped by the breaker limit).
    fn oracle(d: &Dry<'_>, h: &[u32]) -> Vec<(u32, f32)> {
        let m = h.len();
        let limit = d.rep_limit(h);
        let mut best = std::collections::BTreeMap::new();
        if m <= d.allowed_length || limit < d.allowed_length {
            return Vec::new();
        }
        for e in 0..m - 1 {
            let mut n = 0;
            while n <= e && h[e - n] == h[m - 1 - n] {
                n += 1;
            }
            let n = n.min(limit);
            if n >= d.allowed_length {
                let t = h[e + 1];
                let v = best.entry(t).or_insert(0);
                *v = (*v).max(n);
            }
        }
        best.into_iter()
            .filter(|&(t, _)| !d.is_single_token_breaker(t))
            .map(|(t, n)| (t, d.multiplier * d.base.powi((n - d.allowed_length) as i32)))
            .collect()
    }

    #[test]
    fn penalizes_the_continuation_of_a_repeat() {
        // "1 2 3 4 ... 1 2 3": emitting 4 repeats a 3-token run -> 1 * 2^(3-2).
        let h = [1, 2, 3, 4, 9, 9, 1, 2, 3];
        assert_eq!(pens(&dry(&[]), &h), vec![(4, 2.0)]);
        // Repeats shorter than allowed_length are free.
        assert_eq!(pens(&dry(&[]), &[1, 2, 7, 8, 2]), vec![]);
        // A breaker inside the suffix caps the match at the tokens after it:
        // "3" alone (1 < 2) is too short.
        assert_eq!(pens(&dry(&[vec![2]]), &h), vec![]);
        // Multi-token breaker "2 3" ending at the last token: limit 0.
        assert_eq!(pens(&dry(&[vec![2, 3]]), &h), vec![]);
        // A breaker earlier in the history only matters if the suffix reaches it.
        assert_eq!(pens(&dry(&[vec![9, 9, 5]]), &h), vec![(4, 2.0)]);
        // last_n shorter than the earlier occurrence: nothing to match.
        let d = Dry {
            last_n: Some(4),
            ..dry(&[])
        };
        assert_eq!(pens(&d, &h), vec![]);
        // A single-token breaker is never penalized itself.
        let h2 = [5, 6, 0, 5, 6];
        assert_eq!(pens(&dry(&[]), &h2), vec![(0, 1.0)]);
        assert_eq!(pens(&dry(&[vec![0]]), &h2), vec![]);
    }

    #[test]
    fn overlapping_runs_and_exponent_clamp() {
        // "a a a a": suffix "a a a" also ends one earlier -> next "a" gets 2^(3-2).
        assert_eq!(pens(&dry(&[]), &[7, 7, 7, 7]), vec![(7, 2.0)]);
        let long: Vec<u32> = (0..400).map(|i| i % 2).collect();
        let p = pens(
            &Dry {
                base: 10.0,
                ..dry(&[])
            },
            &long,
        );
        assert!(p.iter().all(|x| x.1.is_finite()), "{p:?}");
    }

    #[test]
    fn z_algorithm_matches_brute_force() {
        let mut rng = crate::sampler::rng::Rng::new(5);
        for round in 0..300 {
            let m = 1 + (rng.next_u64() % 60) as usize;
            let alphabet = 2 + (round % 4) as u64;
            let h: Vec<u32> = (0..m).map(|_| (rng.next_u64() % alphabet) as u32).collect();
            let breakers = if round % 3 == 0 {
                vec![vec![1, 0]]
            } else {
                vec![]
            };
            let d = Dry {
                allowed_length: 1 + round % 3,
                ..dry(&breakers)
            };
            assert_eq!(pens(&d, &h), oracle(&d, &h), "{h:?}");
        }
    }
}
