//! Adding the active adapters' deltas after a base product: for every
//! segment of the batch with adapters, for its rows, `out += s B (A x)`.
//! Rank `r` dots of length `n_in`, then `r` axpys of length `n_out`, with
//! the run-time-selected vector kernels. A decode step's deltas are a few
//! hundred microseconds of work spread over ~200 products, so they run on
//! the calling thread (a pool dispatch each would cost more than the work);
//! many rows (a prefill chunk) are split over the pool by rows.

use super::adapter::{ActiveLora, LoraWeight, Store};
use crate::model::forward::{Pass, Segment};
use crate::model::weights::MatRef;
use crate::ops::vec::VecKernels;
use crate::threadpool::{SharedMut, ThreadPool};

/// Rows below which the deltas stay on the calling thread.
const POOL_ROWS: usize = 8;

/// Adds the deltas of matrix `m` to `out` (`n x m.rows`) for input `x`
/// (`n x m.cols`), each segment's rows with that segment's adapters.
pub fn apply(p: &Pass<'_, '_, '_>, m: &MatRef, x: &[f32], out: &mut [f32]) {
    if p.segs.iter().all(|g| g.lora.is_empty()) {
        return;
    }
    let ranges = p
        .segs
        .iter()
        .enumerate()
        .map(|(g, seg)| (seg.lora, p.starts[g], p.starts[g + 1]));
    apply_ranges(p.pool, p.vk, m, x, out, ranges);
}

/// As `apply`, with explicit `(adapters, first row, end row)` ranges (the
/// output head sees only the picked rows).
pub fn apply_ranges<'l>(
    pool: &ThreadPool,
    vk: &VecKernels,
    m: &MatRef,
    x: &[f32],
    out: &mut [f32],
    ranges: impl Iterator<Item = (&'l [ActiveLora], usize, usize)>,
) {
    let (cols, rows) = (m.cols, m.rows);
    for (loras, a, b) in ranges {
        for act in loras {
            let Some(w) = act.adapter.weight_at(m.offset) else {
                continue;
            };
            let scale = act.adapter.scale_for(w, act.scale);
            let (xs, os) = (&x[a * cols..b * cols], &mut out[a * rows..b * rows]);
            if b - a < POOL_ROWS || pool.n_threads() == 1 {
                add_rows(vk, w, scale, xs, os);
            } else {
                let n = b - a;
                let chunks = pool.n_threads().min(n);
                let per = n.div_ceil(chunks);
                let shared = SharedMut::new(os);
                pool.run(chunks, |c| {
                    let (r0, r1) = (c * per, ((c + 1) * per).min(n));
                    if r0 >= r1 {
                        return;
                    }
                    // SAFETY: chunk c alone owns rows r0..r1 of the output.
                    let o = unsafe { shared.slice(r0 * rows, (r1 - r0) * rows) };
                    add_rows(vk, w, scale, &xs[r0 * cols..r1 * cols], o);
                });
            }
        }
    }
}

/// `out[t] += scale * B (A x[t])` for every row `t`.
fn add_rows(vk: &VecKernels, w: &LoraWeight, scale: f32, x: &[f32], out: &mut [f32]) {
    let (r, ni, no) = (w.rank, w.n_in, w.n_out);
    let mut t = vec![0f32; r];
    for (xr, or) in x.chunks_exact(ni).zip(out.chunks_exact_mut(no)) {
        match &w.a {
            Store::F16(a) => {
                for (ti, ar) in t.iter_mut().zip(a.chunks_exact(ni)) {
                    *ti = (vk.dot_f16)(xr, ar) * scale;
                }
            }
            Store::F32(a) => {
                for (ti, ar) in t.iter_mut().zip(a.chunks_exact(ni)) {
                    *ti = (vk.dot)(xr, ar) * scale;
                }
            }
        }
        add_b(vk, &w.bt, &t, no, or);
    }
}

/// `out += sum_j t[j] * Bt[j]`.
fn add_b(vk: &VecKernels, bt: &Store, t: &[f32], no: usize, out: &mut [f32]) {
    match bt {
        Store::F16(b) => {
            for (&tj, br) in t.iter().zip(b.chunks_exact(no)) {
                (vk.axpy_f16)(out, tj, br);
            }
        }
        Store::F32(b) => {
            for (&tj, br) in t.iter().zip(b.chunks_exact(no)) {
                (vk.axpy)(out, tj, br);
            }
        }
    }
}

/// The token embedding's deltas: `x[t] += scale * B a[token t]`, before
/// any embedding multiplier (where llama.cpp adds them). Token ids were
/// checked against the vocabulary by the caller.
pub fn apply_embedding(
    vk: &VecKernels,
    segs: &[Segment<'_>],
    starts: &[usize],
    tokens: &[u32],
    x: &mut [f32],
) {
    for (g, seg) in segs.iter().enumerate() {
        for act in seg.lora {
            let Some(w) = act.adapter.embedding() else {
                continue;
            };
            let scale = act.adapter.scale_for(w, act.scale);
            let (r, e) = (w.rank, w.n_out);
            let mut t = vec![0f32; r];
            for i in starts[g]..starts[g + 1] {
                let tok = tokens[i] as usize;
                match &w.a {
                    Store::F16(a) => {
                        let row = &a[tok * r..(tok + 1) * r];
                        vk_f16_to_f32(vk, row, &mut t);
                    }
                    Store::F32(a) => t.copy_from_slice(&a[tok * r..(tok + 1) * r]),
                }
                t.iter_mut().for_each(|v| *v *= scale);
                add_b(vk, &w.bt, &t, e, &mut x[i * e..(i + 1) * e]);
            }
        }
    }
}

fn vk_f16_to_f32(vk: &VecKernels, src: &[u16], dst: &mut [f32]) {
    (vk.f16_to_f32)(src, dst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::targets::TargetKind;
    use crate::ops::vec;
    use half::f16;

    fn weight(f16_a: bool, f16_b: bool) -> (LoraWeight, Vec<f64>, Vec<f64>) {
        let (r, ni, no) = (5, 37, 23);
        let val = |i: usize, k: f64| ((i as f64 * 0.731 + k).sin() * 0.5) as f32;
        // Values exactly representable in f16 so both precisions agree.
        let round = |x: f32| f16::from_f32(x).to_f32();
        let a: Vec<f32> = (0..r * ni).map(|i| round(val(i, 0.3))).collect();
        let bt: Vec<f32> = (0..r * no).map(|i| round(val(i, 1.7))).collect();
        let store = |v: &[f32], h: bool| {
            if h {
                Store::F16(v.iter().map(|&x| f16::from_f32(x).to_bits()).collect())
            } else {
                Store::F32(v.to_vec())
            }
        };
        let w = LoraWeight {
            name: "t".into(),
            kind: TargetKind::Matmul,
            rank: r,
            n_in: ni,
            n_out: no,
            a: store(&a, f16_a),
            bt: store(&bt, f16_b),
        };
        let to64 = |v: &[f32]| v.iter().map(|&x| x as f64).collect();
        (w, to64(&a), to64(&bt))
    }

    #[test]
    fn delta_matches_float64_in_every_precision_and_kernel_table() {
        let rows = 3;
        for (fa, fb) in [(false, false), (true, true), (true, false), (false, true)] {
            let (w, a, bt) = weight(fa, fb);
            let x: Vec<f32> = (0..rows * w.n_in)
                .map(|i| (i as f32 * 0.37).cos())
                .collect();
            let mut want = vec![0f64; rows * w.n_out];
            for t in 0..rows {
                for j in 0..w.rank {
                    let d: f64 = (0..w.n_in)
                        .map(|i| a[j * w.n_in + i] * x[t * w.n_in + i] as f64)
                        .sum();
                    for o in 0..w.n_out {
                        want[t * w.n_out + o] += 0.75 * d * bt[j * w.n_out + o];
                    }
                }
            }
            for vk in [vec::scalar(), vec::best()] {
                let mut out = vec![1f32; rows * w.n_out];
                add_rows(vk, &w, 0.75, &x, &mut out);
                for (o, e) in out.iter().zip(&want) {
                    assert!(((*o as f64) - 1.0 - e).abs() < 1e-4, "{} {o} {e}", vk.name);
                }
            }
        }
    }

    #[test]
    fn transpose_keeps_every_value() {
        let s = Store::F32((0..12).map(|i| i as f32).collect());
        let Store::F32(t) = s.transposed(3, 4) else {
            panic!("precision changed")
        };
        assert_eq!(t, vec![0., 4., 8., 1., 5., 9., 2., 6., 10., 3., 7., 11.]);
    }
}
