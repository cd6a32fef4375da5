//! Causal grouped-query attention over the KV cache.
//!
//! The unit of work is one KV head with the group of query heads that share
//! it, so each key and value row is loaded once for the whole group. Keys
//! are visited in blocks with an online softmax (running max and sum), so
//! no score matrix is materialized. Prefill splits work by KV head and query
//! block; decode (one query) splits the key range across threads instead and
//! merges the partial softmax states, so two threads stay busy even when a
//! model has fewer KV heads than cores.

use crate::model::kv_cache::{KvCache, KvView};
use crate::ops::vec::VecKernels;
use crate::threadpool::{SharedMut, ThreadPool};

const KEY_BLOCK: usize = 64;
const QUERY_BLOCK: usize = 8;
/// Decode work units to aim for (KV heads x key splits).
const DECODE_UNITS: usize = 16;

pub struct AttnParams {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub dim_k: usize,
    pub dim_v: usize,
    pub scale: f32,
    /// Sliding window: a query at position p sees keys in `(p - w, p]`.
    pub window: Option<usize>,
}

/// Running softmax state for one query head.
struct Partial {
    max: f32,
    sum: f32,
    acc: Vec<f32>,
}

fn dot(vk: &VecKernels, q: &[f32], keys: KvView<'_>, j: usize, d: usize) -> f32 {
    match keys {
        KvView::F16(k) => (vk.dot_f16)(q, &k[j * d..(j + 1) * d]),
        KvView::F32(k) => (vk.dot)(q, &k[j * d..(j + 1) * d]),
    }
}

fn axpy(vk: &VecKernels, acc: &mut [f32], a: f32, vals: KvView<'_>, j: usize, d: usize) {
    match vals {
        KvView::F16(v) => (vk.axpy_f16)(acc, a, &v[j * d..(j + 1) * d]),
        KvView::F32(v) => (vk.axpy)(acc, a, &v[j * d..(j + 1) * d]),
    }
}

/// Folds keys `lo..hi` into `st` for query `q`.
#[allow(clippy::too_many_arguments)]
fn attend(
    vk: &VecKernels,
    q: &[f32],
    keys: KvView<'_>,
    vals: KvView<'_>,
    lo: usize,
    hi: usize,
    p: &AttnParams,
    st: &mut Partial,
    scores: &mut [f32; KEY_BLOCK],
) {
    let mut b = lo;
    while b < hi {
        let e = (b + KEY_BLOCK).min(hi);
        let mut bmax = f32::NEG_INFINITY;
        for j in b..e {
            let s = dot(vk, q, keys, j, p.dim_k) * p.scale;
            scores[j - b] = s;
            bmax = bmax.max(s);
        }
        let new_max = st.max.max(bmax);
        if new_max > st.max {
            let r = (st.max - new_max).exp();
            st.sum *= r;
            st.acc.iter_mut().for_each(|a| *a *= r);
            st.max = new_max;
        }
        for j in b..e {
            let w = (scores[j - b] - st.max).exp();
            st.sum += w;
            axpy(vk, &mut st.acc, w, vals, j, p.dim_v);
        }
        b = e;
    }
}

fn visible(p: &AttnParams, pos: usize) -> (usize, usize) {
    let hi = pos + 1;
    let lo = p.window.map_or(0, |w| hi.saturating_sub(w));
    (lo, hi)
}

/// `q`: `n_tok x n_head x dim_k` (post-RoPE), tokens at positions
/// `pos0..pos0+n_tok` whose keys are already in `cache`. Writes
/// `n_tok x n_head x dim_v` into `out`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &ThreadPool,
    vk: &VecKernels,
    cache: &KvCache,
    layer: usize,
    q: &[f32],
    pos0: usize,
    n_tok: usize,
    p: &AttnParams,
    out: &mut [f32],
) {
    let group = p.n_head / p.n_head_kv;
    let kv_len = pos0 + n_tok;
    let q_stride = p.n_head * p.dim_k;
    let o_stride = p.n_head * p.dim_v;
    let shared_out = SharedMut::new(out);

    if n_tok == 1 {
        // Decode: split the key range so every thread has work.
        let (lo, hi) = visible(p, pos0);
        let span = hi - lo;
        // The split depends on the model and context only, never on the
        // thread count, so results are bit-identical for any thread count.
        let want = DECODE_UNITS.div_ceil(p.n_head_kv).max(1);
        let n_split = want.min(span.div_ceil(KEY_BLOCK)).max(1);
        let per = span.div_ceil(n_split);
        let units = p.n_head_kv * n_split;
        let partials: Vec<std::sync::Mutex<Vec<Partial>>> = (0..units)
            .map(|_| std::sync::Mutex::new(Vec::new()))
            .collect();
        pool.run(units, |u| {
            let (g, s) = (u / n_split, u % n_split);
            let a = lo + s * per;
            let b = (a + per).min(hi);
            let keys = cache.keys(layer, g, kv_len);
            let vals = cache.values(layer, g, kv_len);
            let mut scores = [0f32; KEY_BLOCK];
            let mut res = Vec::with_capacity(group);
            for hq in g * group..(g + 1) * group {
                let mut st = Partial {
                    max: f32::NEG_INFINITY,
                    sum: 0.0,
                    acc: vec![0.0; p.dim_v],
                };
                if a < b {
                    attend(
                        vk,
                        &q[hq * p.dim_k..(hq + 1) * p.dim_k],
                        keys,
                        vals,
                        a,
                        b,
                        p,
                        &mut st,
                        &mut scores,
                    );
                }
                res.push(st);
            }
            *partials[u].lock().unwrap_or_else(|e| e.into_inner()) = res;
        });
        let parts: Vec<Vec<Partial>> = partials
            .into_iter()
            .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
            .collect();
        // SAFETY: the pool has finished; this is the only live view.
        let out = unsafe { shared_out.slice(0, o_stride) };
        for g in 0..p.n_head_kv {
            let splits = &parts[g * n_split..(g + 1) * n_split];
            for gi in 0..group {
                let hq = g * group + gi;
                let o = &mut out[hq * p.dim_v..(hq + 1) * p.dim_v];
                let m = splits
                    .iter()
                    .fold(f32::NEG_INFINITY, |m, sp| m.max(sp[gi].max));
                o.iter_mut().for_each(|x| *x = 0.0);
                let mut sum = 0.0;
                for sp in splits {
                    let st = &sp[gi];
                    if st.sum == 0.0 {
                        continue;
                    }
                    let r = (st.max - m).exp();
                    sum += st.sum * r;
                    (vk.axpy)(o, r, &st.acc);
                }
                let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
                o.iter_mut().for_each(|x| *x *= inv);
            }
        }
        return;
    }

    let n_qblk = n_tok.div_ceil(QUERY_BLOCK);
    pool.run(p.n_head_kv * n_qblk, |u| {
        let (g, qb) = (u / n_qblk, u % n_qblk);
        let keys = cache.keys(layer, g, kv_len);
        let vals = cache.values(layer, g, kv_len);
        let mut scores = [0f32; KEY_BLOCK];
        let mut st = Partial {
            max: 0.0,
            sum: 0.0,
            acc: vec![0.0; p.dim_v],
        };
        for t in qb * QUERY_BLOCK..((qb + 1) * QUERY_BLOCK).min(n_tok) {
            let (lo, hi) = visible(p, pos0 + t);
            for hq in g * group..(g + 1) * group {
                st.max = f32::NEG_INFINITY;
                st.sum = 0.0;
                st.acc.iter_mut().for_each(|x| *x = 0.0);
                let qo = t * q_stride + hq * p.dim_k;
                attend(
                    vk,
                    &q[qo..qo + p.dim_k],
                    keys,
                    vals,
                    lo,
                    hi,
                    p,
                    &mut st,
                    &mut scores,
                );
                let inv = if st.sum > 0.0 { 1.0 / st.sum } else { 0.0 };
                // SAFETY: (t, hq) belongs to exactly one unit (g = hq / group, qb = t / QUERY_BLOCK).
                let o = unsafe { shared_out.slice(t * o_stride + hq * p.dim_v, p.dim_v) };
                for (x, a) in o.iter_mut().zip(&st.acc) {
                    *x = a * inv;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kv_cache::KvDtype;
    use crate::ops::vec;
    use rand::{Rng, SeedableRng};

    /// Naive softmax attention, the oracle.
    fn reference(q: &[f32], ks: &[Vec<f32>], vs: &[Vec<f32>], scale: f32) -> Vec<f32> {
        let s: Vec<f32> = ks
            .iter()
            .map(|k| k.iter().zip(q).map(|(a, b)| a * b).sum::<f32>() * scale)
            .collect();
        let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f32 = w.iter().sum();
        let mut o = vec![0f32; vs[0].len()];
        for (wi, v) in w.iter().zip(vs) {
            for (oi, vi) in o.iter_mut().zip(v) {
                *oi += wi / z * vi;
            }
        }
        o
    }

    #[test]
    fn prefill_and_decode_match_naive_attention() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let (n_head, n_kv, d) = (6, 2, 16);
        let n = 150; // crosses key blocks and query blocks
        for dtype in [KvDtype::F32, KvDtype::F16] {
            for threads in [1, 2, 3] {
                let pool = ThreadPool::new(threads);
                let mut cache = KvCache::new(dtype, 1, 256, n_kv, d, d).unwrap();
                let mut ks = vec![vec![]; n_kv];
                let mut vs = vec![vec![]; n_kv];
                for pos in 0..n {
                    let k: Vec<f32> = (0..n_kv * d).map(|_| rng.random_range(-1.0..1.0)).collect();
                    let v: Vec<f32> = (0..n_kv * d).map(|_| rng.random_range(-1.0..1.0)).collect();
                    cache.store(0, pos, &k, &v);
                    for h in 0..n_kv {
                        ks[h].push(k[h * d..(h + 1) * d].to_vec());
                        vs[h].push(v[h * d..(h + 1) * d].to_vec());
                    }
                }
                let q: Vec<f32> = (0..n * n_head * d)
                    .map(|_| rng.random_range(-1.0..1.0))
                    .collect();
                let p = AttnParams {
                    n_head,
                    n_head_kv: n_kv,
                    dim_k: d,
                    dim_v: d,
                    scale: 0.25,
                    window: None,
                };
                // Prefill of positions 0..n-1, then a decode at the last position.
                let mut out = vec![0f32; (n - 1) * n_head * d];
                attention(
                    &pool,
                    vec::best(),
                    &cache,
                    0,
                    &q[..(n - 1) * n_head * d],
                    0,
                    n - 1,
                    &p,
                    &mut out,
                );
                let mut dec = vec![0f32; n_head * d];
                attention(
                    &pool,
                    vec::best(),
                    &cache,
                    0,
                    &q[(n - 1) * n_head * d..],
                    n - 1,
                    1,
                    &p,
                    &mut dec,
                );
                let tol = if dtype == KvDtype::F16 { 5e-3 } else { 1e-4 };
                for t in [0usize, 1, 63, 64, 100, n - 1] {
                    for h in 0..n_head {
                        let g = h / (n_head / n_kv);
                        let qo = (t * n_head + h) * d;
                        let want = reference(&q[qo..qo + d], &ks[g][..=t], &vs[g][..=t], 0.25);
                        let got = if t == n - 1 {
                            &dec[h * d..(h + 1) * d]
                        } else {
                            &out[qo..qo + d]
                        };
                        for (a, b) in got.iter().zip(&want) {
                            assert!((a - b).abs() < tol, "t={t} h={h} {a} vs {b}");
                        }
                    }
                }
            }
        }
    }
}
