//! Top-k: only the `k` highest logits survive.
//!
//! Runs straight off the logit view, so the full vocabulary is never
//! materialized or sorted: tokens are streamed into a buffer that is cut
//! back to `k` (with `select_nth_unstable`) whenever it fills, after which
//! anything not above the k-th best logit so far is skipped: whole 64-token
//! chunks at once when their maximum is below it.

use super::candidates::Candidates;
use super::edits::View;

/// Fills `c` with the `k` best tokens of `view` (k > 0), sorted best first.
pub fn collect(view: &View<'_>, k: usize, c: &mut Candidates) {
    let k = k.max(1);
    let cap = k.saturating_mul(2).max(k + 256);
    c.clear();
    // Tokens at or below `floor` cannot enter the top k: the dense part of
    // the view arrives in ascending id order, so a later token tying the
    // k-th logit also loses the id tie-break.
    let mut floor = f32::NEG_INFINITY;
    let mut have_floor = false;
    view.scan(|id, logit| {
        if have_floor && logit <= floor {
            return floor;
        }
        c.push(id, logit);
        if c.len() >= cap {
            c.keep_top(k);
            if let Some(last) = c.as_slice().last() {
                floor = last.logit;
                have_floor = c.len() == k;
            }
        }
        if have_floor {
            floor
        } else {
            f32::NEG_INFINITY
        }
    });
    c.keep_top(k);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::edits::Edits;
    use crate::sampler::rng::Rng;

    #[test]
    fn streaming_top_k_matches_a_full_sort() {
        let mut rng = Rng::new(11);
        for &(n, k) in &[(5000usize, 40usize), (300, 1), (100, 500), (4096, 1000)] {
            // Coarse values force many ties; ties rank by lower id.
            let raw: Vec<f32> = (0..n)
                .map(|_| (rng.next_f64() * 50.0).floor() as f32)
                .collect();
            let mut e = Edits::new(n);
            *e.get_mut(&raw, 7).unwrap() = 1e9; // edited tokens join too
            *e.get_mut(&raw, 8).unwrap() = f32::NEG_INFINITY;
            let view = View {
                raw: &raw,
                allowed: None,
                edits: &e,
            };
            let mut c = Candidates::default();
            collect(&view, k, &mut c);
            let mut all: Vec<(f32, u32)> = (0..n as u32)
                .filter(|&i| i != 8)
                .map(|i| (if i == 7 { 1e9 } else { raw[i as usize] }, i))
                .collect();
            all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let want: Vec<u32> = all.iter().take(k).map(|x| x.1).collect();
            let got: Vec<u32> = c.as_slice().iter().map(|x| x.id).collect();
            assert_eq!(got, want, "n={n} k={k}");
        }
    }
}
