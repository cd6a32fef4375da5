//! Repetition penalty (CTRL, Keskar et al.) over the last `window` accepted
//! tokens: each distinct token in the window has a positive logit divided by
//! the penalty and a non-positive one multiplied by it, so a penalty > 1
//! always makes it less likely. Tokens older than the window are untouched.
//!
//! OpenAI's frequency and presence penalties share the window: a token seen
//! `c > 0` times there loses `c * frequency + presence` from its logit
//! (after the repetition penalty, as llama.cpp orders them).

use super::edits::Edits;

/// `frequency` and `presence` as OpenAI defines them (0 is off; negative
/// values encourage repeats).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Additive {
    pub frequency: f32,
    pub presence: f32,
}

impl Additive {
    pub fn is_off(&self) -> bool {
        self.frequency == 0.0 && self.presence == 0.0
    }
}

/// The frequency and presence penalties over the last `window` tokens of
/// `history`; `sorted` is scratch space.
pub fn additive(
    edits: &mut Edits,
    raw: &[f32],
    history: &[u32],
    window: usize,
    pen: Additive,
    sorted: &mut Vec<u32>,
) {
    if pen.is_off() || window == 0 {
        return;
    }
    let start = history.len().saturating_sub(window);
    sorted.clear();
    sorted.extend_from_slice(&history[start..]);
    sorted.sort_unstable();
    for run in sorted.chunk_by(|a, b| a == b) {
        if let Some(l) = edits.get_mut(raw, run[0]) {
            *l -= run.len() as f32 * pen.frequency + pen.presence;
        }
    }
}

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

    /// The logits after one penalty stage, read through the edits view.
    fn apply(raw: &[f32], stage: impl FnOnce(&mut Edits)) -> Vec<f32> {
        let mut e = Edits::new(raw.len());
        stage(&mut e);
        let mut out = vec![f32::NEG_INFINITY; raw.len()];
        View {
            raw,
            allowed: None,
            edits: &e,
        }
        .for_each(|t, l| out[t as usize] = l);
        out
    }

    fn run(raw: &[f32], history: &[u32], window: usize, penalty: f32) -> Vec<f32> {
        apply(raw, |e| {
            repetition(e, raw, history, window, penalty, &mut Vec::new())
        })
    }

    fn run_additive(raw: &[f32], history: &[u32], window: usize, pen: Additive) -> Vec<f32> {
        apply(raw, |e| {
            additive(e, raw, history, window, pen, &mut Vec::new())
        })
    }

    #[test]
    fn frequency_counts_and_presence_once_inside_the_window() {
        let pen = Additive {
            frequency: 0.5,
            presence: 0.25,
        };
        // Window 4 over [3, 0, 0, 1, 0]: token 0 three times, 1 once, 3 not.
        let out = run_additive(&[1.0, 1.0, 1.0, 1.0], &[3, 0, 0, 1, 0], 4, pen);
        assert_eq!(out, vec![1.0 - 1.5 - 0.25, 1.0 - 0.5 - 0.25, 1.0, 1.0]);
        let off = Additive {
            frequency: 0.0,
            presence: 0.0,
        };
        assert_eq!(run_additive(&[1.0, 2.0], &[0, 0], 4, off), vec![1.0, 2.0]);
        assert_eq!(run_additive(&[1.0, 2.0], &[0, 0], 0, pen), vec![1.0, 2.0]);
        // Negative values reward repeats.
        let neg = Additive {
            frequency: -1.0,
            presence: 0.0,
        };
        assert_eq!(run_additive(&[1.0, 2.0], &[1, 1], 8, neg), vec![1.0, 4.0]);
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
