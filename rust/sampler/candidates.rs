//! The working set a truncation stage narrows: (token, logit, probability)
//! triples, plus what is known about their order and normalization so
//! stages do not redo each other's work (no full sort unless a stage needs
//! one; no new `exp` pass when a truncation only needs renormalizing).
//!
//! Ranking is by logit, highest first, then by token id, so every ordering
//! (and so every seeded draw) is deterministic.

use std::cmp::Ordering;

use super::edits::View;
use super::rng::Rng;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cand {
    pub id: u32,
    pub logit: f32,
    pub p: f32,
}

/// What `Cand::p` currently holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probs {
    /// Not computed for the current logits.
    Stale,
    /// Proportional to the probabilities (a truncation removed mass).
    Proportional,
    /// Sums to 1.
    Normalized,
}

pub struct Candidates {
    c: Vec<Cand>,
    /// `c[..sorted]` are the `sorted` best candidates, best first.
    sorted: usize,
    probs: Probs,
}

impl Default for Candidates {
    fn default() -> Self {
        Candidates {
            c: Vec::new(),
            sorted: 0,
            probs: Probs::Stale,
        }
    }
}

fn rank(a: &Cand, b: &Cand) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// `e^x` for `x <= 0`, within 2 ulp of `f32::exp`, and 0 below -86 (where
/// the result would leave the normal f32 range; next to the softmax maximum,
/// which is 1, such tokens carry no mass). Inlined and branch-free, it is
/// several times faster than the libm call on full-vocabulary softmaxes.
#[inline]
pub fn exp_nonpos(x: f32) -> f32 {
    // Cody-Waite: x = n ln2 + r with |r| <= ln2 / 2, e^x = 2^n e^r.
    const LN2_HI: f32 = 0.693_145_75; // few mantissa bits: n * LN2_HI is exact
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let xc = if x > -86.0 { x } else { -86.0 };
    // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits.
    let shifted = xc * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    // Taylor to r^6: truncation error < r^7 / 5040 < 1.3e-7 relative.
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // Scale by 2^n (n in [-124, 0]) by adding n to the exponent field.
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    let scaled = f32::from_bits(p.to_bits().wrapping_add(n_bits << 23));
    if x < -86.0 {
        0.0
    } else {
        scaled
    }
}

/// Shannon entropy (nats) of normalized probabilities.
pub fn entropy(c: &[Cand]) -> f32 {
    c.iter()
        .filter(|x| x.p > 0.0)
        .map(|x| -x.p * x.p.ln())
        .sum()
}

impl Candidates {
    pub fn clear(&mut self) {
        self.c.clear();
        self.sorted = 0;
        self.probs = Probs::Stale;
    }

    pub fn push(&mut self, id: u32, logit: f32) {
        self.c.push(Cand { id, logit, p: 0.0 });
        self.sorted = 0;
        self.probs = Probs::Stale;
    }

    /// Every sampleable token of `view` with a logit of at least `floor`
    /// (-inf: all of them).
    pub fn fill(&mut self, view: &View<'_>, floor: f32) {
        self.clear();
        let c = &mut self.c;
        view.scan(|id, logit| {
            if logit >= floor {
                c.push(Cand { id, logit, p: 0.0 })
            }
            floor
        });
    }

    pub fn len(&self) -> usize {
        self.c.len()
    }

    pub fn as_slice(&self) -> &[Cand] {
        &self.c
    }

    /// Makes `c[..m]` the `m` best, sorted, touching only the unsorted tail.
    pub fn sort_prefix(&mut self, m: usize) {
        let m = m.min(self.c.len());
        if m <= self.sorted {
            return;
        }
        let tail = &mut self.c[self.sorted..];
        let want = m - self.sorted;
        if want < tail.len() {
            tail.select_nth_unstable_by(want - 1, rank);
        }
        tail[..want].sort_unstable_by(rank);
        self.sorted = m;
    }

    /// Keeps the `k` best (at least one), sorted.
    pub fn keep_top(&mut self, k: usize) {
        let k = k.max(1).min(self.c.len());
        self.sort_prefix(k);
        self.truncate(k);
    }

    /// Keeps the first `n` candidates (at least one).
    pub fn truncate(&mut self, n: usize) {
        let n = n.max(1);
        if n < self.c.len() {
            self.c.truncate(n);
            self.sorted = self.sorted.min(n);
            self.mass_removed();
        }
    }

    /// Removes the first `n` candidates, keeping at least one.
    pub fn drop_front(&mut self, n: usize) {
        let n = n.min(self.c.len().saturating_sub(1));
        if n > 0 {
            self.c.drain(..n);
            self.sorted = self.sorted.saturating_sub(n);
            self.mass_removed();
        }
    }

    fn mass_removed(&mut self) {
        if self.probs == Probs::Normalized {
            self.probs = Probs::Proportional;
        }
    }

    /// Probabilities from the logits scaled by `1 / temperature` (> 0),
    /// computed as `exp((l - max) / t)` so tiny temperatures cannot overflow.
    pub fn softmax(&mut self, temperature: f32) {
        let m = self.c.iter().fold(f32::NEG_INFINITY, |m, x| m.max(x.logit));
        let inv_t = 1.0 / temperature;
        // Blocks of 64 through a contiguous buffer, so the exp runs on
        // packed vectors rather than strided through the candidates.
        let mut buf = [0f32; 64];
        let mut total = 0f64;
        for block in self.c.chunks_mut(64) {
            let buf = &mut buf[..block.len()];
            for (b, x) in buf.iter_mut().zip(block.iter()) {
                *b = x.logit - m;
            }
            let mut lanes = [0f32; 8];
            for (i, b) in buf.iter_mut().enumerate() {
                // d == 0 for the maximum: exactly 1 even when inv_t is inf.
                *b = exp_nonpos(if *b == 0.0 { 0.0 } else { *b * inv_t });
                lanes[i % 8] += *b;
            }
            total += lanes.iter().map(|&x| x as f64).sum::<f64>();
            for (x, &b) in block.iter_mut().zip(buf.iter()) {
                x.p = b;
            }
        }
        self.scale(total);
    }

    fn scale(&mut self, sum: f64) {
        if sum > 0.0 {
            let inv = (1.0 / sum) as f32;
            self.c.iter_mut().for_each(|x| x.p *= inv);
        }
        self.probs = Probs::Normalized;
    }

    /// Makes `p` normalized probabilities of the current set (temperature 1
    /// if they were never computed).
    pub fn normalize(&mut self) {
        match self.probs {
            Probs::Normalized => {}
            Probs::Stale => self.softmax(1.0),
            Probs::Proportional => {
                let sum: f64 = self.c.iter().map(|x| x.p as f64).sum();
                self.scale(sum);
            }
        }
    }

    pub fn max_p(&self) -> f32 {
        if self.sorted > 0 {
            self.c[0].p
        } else {
            self.c.iter().fold(0.0, |m, x| m.max(x.p))
        }
    }

    /// Keeps candidates with `p >= cut` (p normalized by the caller); if
    /// none qualifies, keeps the best one. Since `p` grows with the logit the
    /// kept set is always a top set, so a sorted prefix stays a sorted prefix.
    pub fn retain_p_at_least(&mut self, cut: f32) {
        let before = self.c.len();
        let best = self.c.iter().copied().min_by(rank);
        self.c.retain(|x| x.p >= cut);
        if self.c.is_empty() {
            self.c.extend(best);
            self.sorted = self.sorted.min(self.c.len());
        } else {
            self.sorted = self.sorted.min(self.c.len());
        }
        if self.c.len() < before {
            self.mass_removed();
        }
    }

    /// Keeps the candidates at the given positions (any order, no duplicates),
    /// in their current relative order. `positions` is sorted in place.
    pub fn keep_positions(&mut self, positions: &mut [usize]) {
        positions.sort_unstable();
        let n = positions.len().max(1);
        if positions.is_empty() || n >= self.c.len() {
            return;
        }
        for (j, &p) in positions.iter().enumerate() {
            // p >= j because positions are distinct and ascending.
            self.c[j] = self.c[p];
        }
        self.c.truncate(n);
        self.sorted = 0;
        self.mass_removed();
    }

    /// Draws a candidate in proportion to `p`; returns (token, normalized p).
    /// Never returns a zero-probability candidate if any has mass.
    pub fn draw(&mut self, rng: &mut Rng) -> Option<(u32, f32)> {
        self.normalize();
        let mut r = rng.next_f64();
        let mut last = None;
        for x in &self.c {
            if x.p > 0.0 {
                last = Some((x.id, x.p));
                r -= x.p as f64;
                if r < 0.0 {
                    return last;
                }
            }
        }
        // Rounding left a sliver of mass unassigned: it belongs to the last
        // candidate that has any.
        last.or_else(|| self.c.first().map(|x| (x.id, x.p)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(logits: &[f32]) -> Candidates {
        let mut c = Candidates::default();
        for (i, &l) in logits.iter().enumerate() {
            c.push(i as u32, l);
        }
        c
    }

    #[test]
    fn partial_sorts_grow_a_sorted_prefix() {
        let l: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 1000) as f32).collect();
        let mut c = cands(&l);
        c.sort_prefix(10);
        c.sort_prefix(50);
        let ids: Vec<f32> = c.as_slice()[..50].iter().map(|x| x.logit).collect();
        assert_eq!(ids, (950..1000).rev().map(|x| x as f32).collect::<Vec<_>>());
        c.keep_top(3);
        assert_eq!(c.len(), 3);
        assert_eq!(c.as_slice()[0].logit, 999.0);
    }

    #[test]
    fn ties_rank_by_id_and_draws_follow_probabilities() {
        let mut c = cands(&[1.0, 3.0, 3.0, 0.0]);
        c.keep_top(1);
        assert_eq!(c.as_slice()[0].id, 1);
        let mut c = cands(&[0.0, (3.0f32).ln()]);
        let mut rng = Rng::new(7);
        let n = 20000;
        let ones = (0..n)
            .filter(|_| c.draw(&mut rng).map(|d| d.0) == Some(1))
            .count();
        assert!((ones as f64 / n as f64 - 0.75).abs() < 0.02, "{ones}");
    }

    #[test]
    fn fast_exp_matches_libm() {
        let mut worst = 0f64;
        let mut x = 0f32;
        while x > -86.0 {
            let (got, want) = (exp_nonpos(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
            x -= 0.000_37;
        }
        assert!(worst < 2.5e-7, "relative error {worst}");
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert_eq!(exp_nonpos(-90.0), 0.0);
        assert_eq!(exp_nonpos(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn softmax_survives_tiny_temperatures_and_renormalizes() {
        let mut c = cands(&[1.0, 2.0, 2.0, -1e30]);
        c.softmax(1e-30);
        let p: Vec<f32> = c.as_slice().iter().map(|x| x.p).collect();
        assert_eq!(p, vec![0.0, 0.5, 0.5, 0.0]);
        let mut c = cands(&[0.0, 0.0, 0.0, 0.0]);
        c.normalize();
        c.truncate(2);
        c.normalize();
        assert!(c.as_slice().iter().all(|x| (x.p - 0.5).abs() < 1e-6));
    }
}
