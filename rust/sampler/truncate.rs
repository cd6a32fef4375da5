//! Truncation stages: each keeps a subset of the candidates (never empty).

use super::candidates::Candidates;

/// Shannon entropy (nats) of the candidates' probabilities.
fn entropy(c: &Candidates) -> f32 {
    c.c.iter()
        .filter(|x| x.p > 0.0)
        .map(|x| -x.p * x.p.ln())
        .sum()
}

pub fn top_k(c: &mut Candidates, k: i32) {
    if k > 0 {
        c.keep_top(k as usize);
    }
}

/// Smallest set of most probable tokens whose mass reaches `p`.
pub fn top_p(c: &mut Candidates, p: f32) {
    if p >= 1.0 {
        return;
    }
    c.sort();
    c.softmax();
    let mut cum = 0.0;
    let mut keep = c.c.len();
    for (i, x) in c.c.iter().enumerate() {
        cum += x.p;
        if cum >= p {
            keep = i + 1;
            break;
        }
    }
    c.c.truncate(keep.max(1));
}

/// Tokens at least `min_p` times as likely as the most likely one.
pub fn min_p(c: &mut Candidates, min_p: f32) {
    if min_p <= 0.0 {
        return;
    }
    c.softmax();
    let cut = min_p * c.max_p();
    c.retain_p(|p| p >= cut);
}

/// Locally typical sampling: keep tokens whose surprise is closest to the
/// entropy until `typical_p` of the mass is covered.
pub fn typical(c: &mut Candidates, typical_p: f32) {
    if typical_p >= 1.0 {
        return;
    }
    c.softmax();
    let h = entropy(c);
    let mut idx: Vec<usize> = (0..c.c.len()).collect();
    let dev = |x: f32| {
        if x > 0.0 {
            (-x.ln() - h).abs()
        } else {
            f32::INFINITY
        }
    };
    idx.sort_by(|&a, &b| dev(c.c[a].p).total_cmp(&dev(c.c[b].p)));
    let mut cum = 0.0;
    let mut keep = idx.len();
    for (i, &j) in idx.iter().enumerate() {
        cum += c.c[j].p;
        if cum >= typical_p {
            keep = i + 1;
            break;
        }
    }
    let chosen: Vec<_> = idx[..keep.max(1)].iter().map(|&j| c.c[j]).collect();
    c.c = chosen;
    c.sorted = false;
}

/// Top-a: keep tokens with `p >= a * p_max^2`.
pub fn top_a(c: &mut Candidates, a: f32) {
    if a <= 0.0 {
        return;
    }
    c.softmax();
    let m = c.max_p();
    let cut = a * m * m;
    c.retain_p(|p| p >= cut);
}

/// Epsilon cutoff (absolute) and eta cutoff (entropy-adaptive).
pub fn eta_epsilon(c: &mut Candidates, eta: f32, epsilon: f32) {
    if epsilon > 0.0 {
        c.softmax();
        c.retain_p(|p| p >= epsilon);
    }
    if eta > 0.0 {
        c.softmax();
        let h = entropy(c);
        let cut = eta.min(eta.sqrt() * (-h).exp());
        c.retain_p(|p| p >= cut);
    }
}

/// XTC: when it fires, removes every token above `threshold` except the
/// least probable of them, steering away from the most predictable choices.
pub fn xtc(c: &mut Candidates, threshold: f32, fire: bool) {
    if !fire {
        return;
    }
    c.sort();
    c.softmax();
    let above = c.c.iter().take_while(|x| x.p >= threshold).count();
    if above >= 2 {
        c.c.drain(..above - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(logits: &[f32]) -> Candidates {
        let mut c = Candidates::default();
        c.fill(logits);
        c
    }
    fn ids(c: &Candidates) -> Vec<u32> {
        let mut v: Vec<u32> = c.c.iter().map(|x| x.id).collect();
        v.sort();
        v
    }

    #[test]
    fn each_stage_keeps_its_defining_set() {
        let l = [(0.5f32).ln(), (0.3f32).ln(), (0.15f32).ln(), (0.05f32).ln()];
        let mut c = cands(&l);
        top_k(&mut c, 2);
        assert_eq!(ids(&c), vec![0, 1]);
        let mut c = cands(&l);
        top_p(&mut c, 0.75);
        assert_eq!(ids(&c), vec![0, 1]);
        let mut c = cands(&l);
        min_p(&mut c, 0.2); // cut at 0.1
        assert_eq!(ids(&c), vec![0, 1, 2]);
        let mut c = cands(&l);
        top_a(&mut c, 0.5); // cut at 0.125
        assert_eq!(ids(&c), vec![0, 1, 2]);
        let mut c = cands(&l);
        eta_epsilon(&mut c, 0.0, 0.1);
        assert_eq!(ids(&c), vec![0, 1, 2]);
        let mut c = cands(&l);
        xtc(&mut c, 0.2, true); // 0.5 and 0.3 are above: keep only 0.3 of them
        assert_eq!(ids(&c), vec![1, 2, 3]);
        let mut c = cands(&l);
        xtc(&mut c, 0.2, false);
        assert_eq!(ids(&c), vec![0, 1, 2, 3]);
    }
}
