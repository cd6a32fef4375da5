//! DRY ("don't repeat yourself"): penalizes the token that would extend a
//! sequence already seen in the history, growing exponentially with the
//! length of the repeat beyond `allowed_length`.

use std::collections::HashMap;

/// Longest repeat considered; longer ones are penalized as this long.
const MAX_MATCH: usize = 64;

pub struct Dry<'a> {
    pub multiplier: f32,
    pub base: f32,
    pub allowed_length: usize,
    pub last_n: Option<usize>,
    pub breakers: &'a [Vec<u32>],
}

impl Dry<'_> {
    fn is_breaker(&self, t: u32) -> bool {
        self.breakers.iter().any(|b| b.contains(&t))
    }

    /// Penalty per token id.
    pub fn penalties(&self, history: &[u32]) -> HashMap<u32, f32> {
        let mut out = HashMap::new();
        if self.multiplier == 0.0 || history.len() < 2 {
            return out;
        }
        let start = self.last_n.map_or(0, |n| history.len().saturating_sub(n));
        let s = &history[start..];
        let n = s.len();
        let last = s[n - 1];
        if self.is_breaker(last) {
            return out;
        }
        let mut best: HashMap<u32, usize> = HashMap::new();
        // A match ends at j-1 and is followed by s[j], the token that would repeat.
        for j in 1..n {
            if s[j - 1] != last {
                continue;
            }
            let next = s[j];
            if self.is_breaker(next) {
                continue;
            }
            let mut len = 0;
            while len < MAX_MATCH && len < j && j - 1 - len < n - 1 - len {
                let (a, b) = (s[j - 1 - len], s[n - 1 - len]);
                if a != b || self.is_breaker(a) {
                    break;
                }
                len += 1;
            }
            let e = best.entry(next).or_insert(0);
            *e = (*e).max(len);
        }
        for (tok, len) in best {
            if len >= self.allowed_length {
                let p = self.multiplier * self.base.powi((len - self.allowed_length) as i32);
                out.insert(tok, p);
            }
        }
        out
    }

    pub fn apply(&self, logits: &mut [f32], history: &[u32]) {
        for (tok, p) in self.penalties(history) {
            if let Some(l) = logits.get_mut(tok as usize) {
                *l -= p;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalizes_the_continuation_of_a_repeat() {
        let d = Dry {
            multiplier: 1.0,
            base: 2.0,
            allowed_length: 2,
            last_n: None,
            breakers: &[],
        };
        // "a b c d ... a b c" -> continuing with d repeats a 3-token sequence.
        let h = [1, 2, 3, 4, 9, 9, 1, 2, 3];
        let p = d.penalties(&h);
        assert_eq!(p.get(&4), Some(&2.0)); // 1 * 2^(3-2)
        assert!(!p.contains_key(&9));
        let with_breaker = Dry {
            breakers: &[vec![2]],
            ..d
        };
        assert!(!with_breaker.penalties(&h).contains_key(&4));
    }
}
