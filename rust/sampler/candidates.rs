//! The working set of (token, logit, probability) a sampler stage narrows.

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cand {
    pub id: u32,
    pub logit: f32,
    pub p: f32,
}

#[derive(Default)]
pub struct Candidates {
    pub c: Vec<Cand>,
    /// True when `c` is sorted by logit, highest first.
    pub sorted: bool,
}

impl Candidates {
    /// Fills from full logits, dropping `-inf` (banned or masked) tokens.
    pub fn fill(&mut self, logits: &[f32]) {
        self.c.clear();
        self.c.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, &l)| l > f32::NEG_INFINITY)
                .map(|(i, &l)| Cand {
                    id: i as u32,
                    logit: l,
                    p: 0.0,
                }),
        );
        self.sorted = false;
    }

    pub fn sort(&mut self) {
        if !self.sorted {
            self.c
                .sort_unstable_by(|a, b| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id)));
            self.sorted = true;
        }
    }

    /// Keeps the `k` highest logits (sorted), without sorting the whole vocabulary.
    pub fn keep_top(&mut self, k: usize) {
        let k = k.max(1);
        if k < self.c.len() {
            self.c.select_nth_unstable_by(k - 1, |a, b| {
                b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
            });
            self.c.truncate(k);
            self.sorted = false;
        }
        self.sort();
    }

    /// Softmax of the current logits into `p`.
    pub fn softmax(&mut self) {
        let m = self.c.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.logit));
        let mut sum = 0f64;
        for c in &mut self.c {
            c.p = (c.logit - m).exp();
            sum += c.p as f64;
        }
        let inv = (1.0 / sum) as f32;
        self.c.iter_mut().for_each(|c| c.p *= inv);
    }

    pub fn max_p(&self) -> f32 {
        self.c.iter().fold(0.0, |m, c| m.max(c.p))
    }

    /// Keeps candidates whose probability satisfies `keep`, never fewer than one
    /// (the most probable survives).
    pub fn retain_p(&mut self, keep: impl Fn(f32) -> bool) {
        let best = self
            .c
            .iter()
            .copied()
            .max_by(|a, b| a.p.total_cmp(&b.p).then(b.id.cmp(&a.id)));
        self.c.retain(|c| keep(c.p));
        if self.c.is_empty() {
            self.c.extend(best);
        }
    }
}
