//! Sparse logit edits. Bias, bans, the repetition penalty and DRY touch a
//! handful of tokens out of a vocabulary of 50k-260k, so instead of copying
//! and rewriting the whole logit vector they record edited values here; the
//! dense passes ([`View::for_each`]) read raw logits for untouched tokens and
//! the edited value for the rest, in a single pass with no allocation.

/// Marks a token with no edit in `Edits::slot`.
const NONE: u32 = u32::MAX;

pub struct Edits {
    /// Token id -> index into `list`, or `NONE`. Vocabulary-sized, reused.
    slot: Vec<u32>,
    /// Bitset of edited tokens (64 per word), for cheap skipping in dense passes.
    touched: Vec<u64>,
    /// (token, edited logit) in first-touch order.
    list: Vec<(u32, f32)>,
}

impl Edits {
    pub fn new(vocab_size: usize) -> Self {
        Edits {
            slot: vec![NONE; vocab_size],
            touched: vec![0; vocab_size.div_ceil(64)],
            list: Vec::new(),
        }
    }

    /// Forgets every edit; costs O(edits), not O(vocabulary).
    pub fn clear(&mut self) {
        for &(t, _) in &self.list {
            let i = t as usize;
            self.slot[i] = NONE;
            self.touched[i / 64] &= !(1u64 << (i % 64));
        }
        self.list.clear();
    }

    /// The edited logit of token `t`, starting from `raw[t]` on first touch
    /// (NaN reads as -inf). `None` for ids outside the vocabulary.
    pub fn get_mut(&mut self, raw: &[f32], t: u32) -> Option<&mut f32> {
        let i = t as usize;
        let s = *self.slot.get(i)?;
        let idx = if s == NONE {
            let r = *raw.get(i)?;
            let idx = self.list.len();
            self.slot[i] = idx as u32;
            self.touched[i / 64] |= 1u64 << (i % 64);
            self.list
                .push((t, if r.is_nan() { f32::NEG_INFINITY } else { r }));
            idx
        } else {
            s as usize
        };
        self.list.get_mut(idx).map(|e| &mut e.1)
    }

    #[cfg(test)]
    pub fn list(&self) -> &[(u32, f32)] {
        &self.list
    }
}

/// The logits as the chain sees them after the edits and the allowed mask.
pub struct View<'a> {
    pub raw: &'a [f32],
    /// Bitset over the vocabulary (bit i set = token i allowed), already
    /// checked to cover `raw`.
    pub allowed: Option<&'a [u64]>,
    pub edits: &'a Edits,
}

impl View<'_> {
    fn allowed(&self, i: usize) -> bool {
        self.allowed
            .is_none_or(|m| m.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1))
    }

    /// Calls `f(token, logit)` for every sampleable token: not masked, not
    /// -inf or NaN. `+inf` is clamped to `f32::MAX` so softmax stays finite.
    /// Untouched tokens come first in ascending id order, then edited ones.
    #[cfg(test)]
    pub fn for_each(&self, mut f: impl FnMut(u32, f32)) {
        self.scan(|t, l| {
            f(t, l);
            f32::NEG_INFINITY
        });
    }

    /// Like [`View::for_each`], but `f` returns a floor: untouched tokens
    /// with a logit below the latest floor are skipped, whole 64-token
    /// chunks at a time when their maximum is below it. Edited tokens are
    /// always passed to `f`.
    #[inline]
    pub fn scan(&self, mut f: impl FnMut(u32, f32) -> f32) {
        let mut floor = f32::NEG_INFINITY;
        for (w, chunk) in self.raw.chunks(64).enumerate() {
            let mut live = !self.edits.touched.get(w).copied().unwrap_or(0);
            if let Some(m) = self.allowed {
                live &= m.get(w).copied().unwrap_or(0);
            }
            let base = (w * 64) as u32;
            if live == u64::MAX {
                if floor > f32::NEG_INFINITY && chunk_max(chunk).min(f32::MAX) < floor {
                    continue;
                }
                for (j, &l) in chunk.iter().enumerate() {
                    if l > f32::NEG_INFINITY && l.min(f32::MAX) >= floor {
                        floor = f(base + j as u32, l.min(f32::MAX));
                    }
                }
            } else {
                while live != 0 {
                    let j = live.trailing_zeros();
                    live &= live - 1;
                    if let Some(&l) = chunk.get(j as usize) {
                        if l > f32::NEG_INFINITY && l.min(f32::MAX) >= floor {
                            floor = f(base + j, l.min(f32::MAX));
                        }
                    }
                }
            }
        }
        for &(t, l) in &self.edits.list {
            if l > f32::NEG_INFINITY && self.allowed(t as usize) {
                f(t, l.min(f32::MAX));
            }
        }
    }

    /// The best token (highest logit, lowest id on ties) in one pass.
    /// Chunks with no edit and no mask take a branch-free max over eight
    /// lanes; only a chunk that beats the best so far is searched for the
    /// position.
    pub fn argmax(&self) -> Option<u32> {
        fn consider(best: &mut Option<(u32, f32)>, t: u32, l: f32) {
            if best.is_none_or(|(bt, bl)| l > bl || (l == bl && t < bt)) {
                *best = Some((t, l));
            }
        }
        let mut best: Option<(u32, f32)> = None;
        for (w, chunk) in self.raw.chunks(64).enumerate() {
            let mut live = !self.edits.touched.get(w).copied().unwrap_or(0);
            if let Some(m) = self.allowed {
                live &= m.get(w).copied().unwrap_or(0);
            }
            let base = (w * 64) as u32;
            if live == u64::MAX {
                let m = chunk_max(chunk);
                if m > f32::NEG_INFINITY && best.is_none_or(|(_, bl)| m.min(f32::MAX) > bl) {
                    if let Some(j) = chunk.iter().position(|&x| x == m) {
                        best = Some((base + j as u32, m.min(f32::MAX)));
                    }
                }
            } else {
                while live != 0 {
                    let j = live.trailing_zeros();
                    live &= live - 1;
                    if let Some(&l) = chunk.get(j as usize) {
                        if l > f32::NEG_INFINITY {
                            consider(&mut best, base + j, l.min(f32::MAX));
                        }
                    }
                }
            }
        }
        for &(t, l) in &self.edits.list {
            if l > f32::NEG_INFINITY && self.allowed(t as usize) {
                consider(&mut best, t, l.min(f32::MAX));
            }
        }
        best.map(|(t, _)| t)
    }

    /// The highest sampleable logit, if any.
    pub fn max_logit(&self) -> Option<f32> {
        let t = self.argmax()? as usize;
        let l = match self.edits.slot.get(t) {
            Some(&s) if s != NONE => self.edits.list.get(s as usize)?.1,
            _ => *self.raw.get(t)?,
        };
        Some(l.min(f32::MAX))
    }
}

/// Max of a chunk ignoring NaN (-inf if none), in eight independent lanes
/// the compiler turns into vector max instructions.
#[inline]
fn chunk_max(chunk: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let mut it = chunk.chunks_exact(8);
    for c8 in &mut it {
        for (a, &x) in acc.iter_mut().zip(c8) {
            *a = if x > *a { x } else { *a };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &x in acc.iter().chain(it.remainder()) {
        m = if x > m { x } else { m };
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_merges_edits_mask_and_raw_values() {
        let raw: Vec<f32> = (0..130).map(|i| i as f32).collect();
        let mut e = Edits::new(130);
        *e.get_mut(&raw, 129).unwrap() = f32::NEG_INFINITY;
        *e.get_mut(&raw, 3).unwrap() += 1000.0;
        assert!(e.get_mut(&raw, 130).is_none());
        let mut mask = vec![u64::MAX; 3];
        mask[1] &= !(1 << (100 - 64)); // token 100 masked
        let v = View {
            raw: &raw,
            allowed: Some(&mask),
            edits: &e,
        };
        let mut seen = Vec::new();
        v.for_each(|t, l| seen.push((t, l)));
        assert_eq!(seen.len(), 128); // 130 - banned 129 - masked 100
        assert!(seen.contains(&(3, 1003.0)));
        assert!(!seen.iter().any(|&(t, _)| t == 100 || t == 129));
        assert_eq!(v.argmax(), Some(3));
        e.clear();
        assert!(e.list().is_empty());
        let v = View {
            raw: &raw,
            allowed: None,
            edits: &e,
        };
        assert_eq!(v.argmax(), Some(129));
    }

    #[test]
    fn nan_and_infinities() {
        let raw = [f32::NAN, f32::INFINITY, 1.0, f32::NEG_INFINITY];
        let e = Edits::new(4);
        let v = View {
            raw: &raw,
            allowed: None,
            edits: &e,
        };
        let mut seen = Vec::new();
        v.for_each(|t, l| seen.push((t, l)));
        assert_eq!(seen, vec![(1, f32::MAX), (2, 1.0)]);
        assert_eq!(v.argmax(), Some(1));
        assert_eq!(v.max_logit(), Some(f32::MAX));
    }

    #[test]
    fn fast_argmax_agrees_with_a_plain_scan() {
        let mut rng = crate::sampler::rng::Rng::new(4);
        for round in 0..200 {
            let n = 1 + (rng.next_u64() % 700) as usize;
            let raw: Vec<f32> = (0..n)
                .map(|_| match rng.next_u64() % 20 {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 if round % 5 == 0 => f32::INFINITY,
                    _ => (rng.next_u64() % 30) as f32, // many ties
                })
                .collect();
            let mut e = Edits::new(n);
            for _ in 0..(round % 4) {
                let t = (rng.next_u64() % n as u64) as u32;
                *e.get_mut(&raw, t).unwrap() = (rng.next_u64() % 35) as f32;
            }
            let mask: Vec<u64> = (0..n.div_ceil(64))
                .map(|_| rng.next_u64() | rng.next_u64())
                .collect();
            for allowed in [None, Some(&mask[..])] {
                let v = View {
                    raw: &raw,
                    allowed,
                    edits: &e,
                };
                let mut best: Option<(u32, f32)> = None;
                v.for_each(|t, l| {
                    if best.is_none_or(|(bt, bl)| l > bl || (l == bl && t < bt)) {
                        best = Some((t, l));
                    }
                });
                assert_eq!(v.argmax(), best.map(|b| b.0));
                assert_eq!(v.max_logit(), best.map(|b| b.1));
            }
        }
    }
}
