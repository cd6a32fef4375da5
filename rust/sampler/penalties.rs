//! Stages that act on the full logit vector before any truncation.

use std::collections::HashSet;

/// Adds each bias to its token's logit.
pub fn logit_bias(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(l) = logits.get_mut(id as usize) {
            *l += b;
        }
    }
}

/// Banned tokens can never be sampled.
pub fn ban(logits: &mut [f32], banned: &[u32]) {
    for &id in banned {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// CTRL-style repetition penalty over the last `window` tokens: positive
/// logits are divided by the penalty, negative ones multiplied, once per
/// distinct token.
pub fn repetition(logits: &mut [f32], history: &[u32], window: usize, penalty: f32) {
    if penalty == 1.0 || window == 0 {
        return;
    }
    let start = history.len().saturating_sub(window);
    let mut seen = HashSet::new();
    for &t in &history[start..] {
        if seen.insert(t) {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repetition_only_inside_window() {
        let mut l = vec![2.0, -2.0, 2.0, 2.0];
        repetition(&mut l, &[2, 0, 1, 0], 3, 2.0);
        assert_eq!(l, vec![1.0, -4.0, 2.0, 2.0]);
    }
}
