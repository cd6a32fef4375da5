//! Repetition penalty (CTRL, Keskar et al.) over the last `window` accepted
//! tokens: each distinct token in the window has a positive logit divided by
//! the penalty and a non-positive one multiplied by it, so a penalty > 1
//! always makes it less likely. Tokens older than the window are untouched.

use super::edits::Edits;

pub fn repetition(
    edits: &mut Edits,
    raw: &[f32],
    history: &[u32],
    window: usize,
    penalty: f32,
    distinct: &mut Vec<u32>,
) {
    if penalty == 1.0 || window == 0 {
        return;
    }
    let start = history.len().saturating_sub(window);
    distinct.clear();
    distinct.extend_from_slice(&history[start..]);
    distinct.sort_unstable();
    distinct.dedup();
    for &t in distinct.iter() {
        if let Some(l) = edits.get_mut(raw, t) {
            *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::edits::View;

    fn run(raw: &[f32], history: &[u32], window: usize, penalty: f32) -> Vec<f32> {
        let mut e = Edits::new(raw.len());
        repetition(&mut e, raw, history, window, penalty, &mut Vec::new());
        let mut out = vec![f32::NEG_INFINITY; raw.len()];
        View {
            raw,
            allowed: None,
            edits: &e,
        }
        .for_each(|t, l| out[t as usize] = l);
        out
    }

    #[test]
    fn divides_positive_multiplies_negative_inside_the_window_only() {
        // Window of 3 over [2, 0, 1, 0]: tokens 0 and 1 (once each), not 2.
        let out = run(&[2.0, -2.0, 2.0, 2.0], &[2, 0, 1, 0], 3, 2.0);
        assert_eq!(out, vec![1.0, -4.0, 2.0, 2.0]);
        assert_eq!(run(&[2.0, -2.0], &[0, 1], 2, 1.0), vec![2.0, -2.0]);
        assert_eq!(run(&[2.0, -2.0], &[0, 1], 0, 3.0), vec![2.0, -2.0]);
        // Penalties below 1 encourage repeats symmetrically.
        assert_eq!(run(&[2.0, -2.0], &[0, 1], 8, 0.5), vec![4.0, -1.0]);
    }
}
