//! Logit bias and banned tokens: the user's explicit wishes, applied first.

use super::edits::Edits;

/// Adds each bias to its token's logit (repeated ids add up).
pub fn logit_bias(edits: &mut Edits, raw: &[f32], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(l) = edits.get_mut(raw, id) {
            *l += b;
        }
    }
}

/// Banned tokens get -inf: no later stage can bring them back.
pub fn ban(edits: &mut Edits, raw: &[f32], banned: &[u32]) {
    for &id in banned {
        if let Some(l) = edits.get_mut(raw, id) {
            *l = f32::NEG_INFINITY;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::edits::View;

    #[test]
    fn bias_shifts_and_bans_win() {
        let raw = [1.0, 2.0, 3.0];
        let mut e = Edits::new(3);
        logit_bias(&mut e, &raw, &[(0, 5.0), (0, 0.5), (2, 100.0), (9, 1.0)]);
        ban(&mut e, &raw, &[2]);
        let mut seen = Vec::new();
        View {
            raw: &raw,
            allowed: None,
            edits: &e,
        }
        .for_each(|t, l| seen.push((t, l)));
        seen.sort_by_key(|x| x.0);
        assert_eq!(seen, vec![(0, 6.5), (1, 2.0)]);
    }
}
