//! Log-probabilities of the model's own distribution (the raw logits, before
//! any sampler stage), as OpenAI's `logprobs` report them: the chosen
//! token's and the `k` most likely tokens'. The log-sum-exp runs in f64 so a
//! 262k-token vocabulary loses nothing to the summation order.

/// The log-probability of `token` and the `k` most likely tokens, most
/// likely first (ties by lower id). `None` when `token` is outside `logits`
/// or no logit is finite.
pub fn logprobs(logits: &[f32], token: usize, k: usize) -> Option<(f32, Vec<(u32, f32)>)> {
    let chosen = *logits.get(token)?;
    let max = logits
        .iter()
        .copied()
        .filter(|l| l.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return None;
    }
    let m = f64::from(max);
    let sum: f64 = logits
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| (f64::from(l) - m).exp())
        .sum();
    let lse = m + sum.ln();
    let lp = |l: f32| (f64::from(l) - lse) as f32;
    Some((
        lp(chosen),
        top(logits, k)
            .into_iter()
            .map(|t| (t, lp(logits[t as usize])))
            .collect(),
    ))
}

/// Ids of the `k` largest logits, largest first, ties by lower id, in one
/// pass with a small sorted buffer (k is at most a few dozen).
fn top(logits: &[f32], k: usize) -> Vec<u32> {
    let k = k.min(logits.len());
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return Vec::new();
    }
    // The ordering `a` before `b`: larger logit, then lower id.
    let before = |a: (f32, u32), b: (f32, u32)| a.0 > b.0 || (a.0 == b.0 && a.1 < b.1);
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        let c = (l, i as u32);
        if best.len() == k && !before(c, best[k - 1]) {
            continue;
        }
        let at = best.partition_point(|&b| before(b, c));
        best.insert(at, c);
        best.truncate(k);
    }
    best.into_iter().map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_float64_log_softmax_and_sorts_the_top() {
        let logits: Vec<f32> = (0..1000).map(|i| ((i as f32) * 0.37).sin() * 8.0).collect();
        let m = logits.iter().copied().fold(f32::MIN, f32::max) as f64;
        let lse = m + logits
            .iter()
            .map(|&l| (l as f64 - m).exp())
            .sum::<f64>()
            .ln();
        let (lp, top) = logprobs(&logits, 17, 5).expect("finite");
        assert!((lp as f64 - (logits[17] as f64 - lse)).abs() < 1e-6);
        let mut ids: Vec<u32> = (0..1000).collect();
        ids.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), ids[..5]);
        assert!(top.windows(2).all(|w| w[0].1 >= w[1].1));
    }

    #[test]
    fn ties_go_to_the_lower_id_and_masked_tokens_are_impossible() {
        let logits = [1.0, 3.0, 3.0, f32::NEG_INFINITY];
        let (lp, top) = logprobs(&logits, 3, 4).expect("finite");
        assert_eq!(lp, f32::NEG_INFINITY);
        assert_eq!(
            top.iter().map(|t| t.0).collect::<Vec<_>>(),
            vec![1, 2, 0, 3]
        );
        assert_eq!(logprobs(&logits, 4, 1), None);
        assert_eq!(logprobs(&[f32::NEG_INFINITY], 0, 1), None);
        assert!(logprobs(&logits, 0, 0).expect("finite").1.is_empty());
    }
}
