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
