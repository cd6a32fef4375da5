//! Adding the active adapters' deltas after a base product: for every
//! segment of the batch with adapters, for its rows, `out += s B (A x)`.
//! Rank `r` dots of length `n_in`, then `r` axpys of length `n_out`, with
//! the run-time-selected vector kernels. Each row's delta is formed in one
//! fixed order (two halves of the ranks, see `row_delta`), so a row gets
//! the same bits alone, in a batch of streams or in a prefill, on any
//! number of threads. Tiny products stay on the calling thread; otherwise
//! one dispatch per product spreads rows (or a lone row's two halves) over
//! the pool, whose workers are still spinning from the base product.

use super::adapter::{ActiveLora, LoraWeight, Store};
use super::kernels;
use crate::model::pass::{Pass, Segment};
use crate::model::weights::MatRef;
use crate::ops::vec::VecKernels;
use crate::threadpool::{SharedMut, ThreadPool};

/// Below this many multiply-adds a hook's deltas stay on the calling
/// thread: a dispatch to spinning workers costs a few microseconds.
const POOL_WORK: usize = 32 * 1024;

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

/// Rows `r0..r1` of one segment with its (weight, effective scale) pairs.
struct Piece<'w> {
    ws: Vec<(&'w LoraWeight, f32)>,
    r0: usize,
    r1: usize,
}

/// Which ranks of a pair form half `h` (0 or 1) of its product.
fn half(w: &LoraWeight, h: usize) -> (usize, usize) {
    let mid = w.rank / 2;
    if h == 0 {
        (0, mid)
    } else {
        (mid, w.rank)
    }
}

/// The delta of one row, always in the same order whoever computes it:
/// the first half of every pair's ranks into `out`, the second half into
/// `buf`, then `out += buf`. A lone decode row runs the two halves on two
/// threads; any other row runs both on one, with the same bits.
fn row_delta(
    vk: &VecKernels,
    ws: &[(&LoraWeight, f32)],
    x: &[f32],
    out: &mut [f32],
    buf: &mut [f32],
) {
    for &(w, scale) in ws {
        let (k0, k1) = half(w, 0);
        add_rows(vk, w, scale, x, out, k0, k1);
    }
    buf.fill(0.0);
    for &(w, scale) in ws {
        let (k0, k1) = half(w, 1);
        add_rows(vk, w, scale, x, buf, k0, k1);
    }
    out.iter_mut().zip(buf.iter()).for_each(|(o, b)| *o += b);
}

fn rows_delta(
    vk: &VecKernels,
    pc: &Piece<'_>,
    x: &[f32],
    out: &mut [f32],
    cols: usize,
    rows: usize,
) {
    let mut buf = vec![0f32; rows];
    for (xr, or) in x.chunks_exact(cols).zip(out.chunks_exact_mut(rows)) {
        row_delta(vk, &pc.ws, xr, or, &mut buf);
    }
}

/// As `apply`, with explicit `(adapters, first row, end row)` ranges (the
/// output head sees only the picked rows). Several rows (a batch of
/// streams, a prefill chunk) are spread over the pool by rows; a lone row
/// by the two halves of its ranks (see `row_delta`).
pub fn apply_ranges<'l>(
    pool: &ThreadPool,
    vk: &VecKernels,
    m: &MatRef,
    x: &[f32],
    out: &mut [f32],
    ranges: impl Iterator<Item = (&'l [ActiveLora], usize, usize)>,
) {
    let (cols, rows) = (m.cols, m.rows);
    let mut items: Vec<Piece<'_>> = Vec::new();
    let mut work = 0;
    for (loras, a, b) in ranges {
        let ws: Vec<(&LoraWeight, f32)> = loras
            .iter()
            .filter_map(|act| {
                let w = act.adapter.weight_at(m.offset)?;
                Some((w, act.adapter.scale_for(w, act.scale)))
            })
            .collect();
        if ws.is_empty() || a == b {
            continue;
        }
        work += (b - a)
            * ws.iter()
                .map(|(w, _)| w.rank * (w.n_in + w.n_out))
                .sum::<usize>();
        items.push(Piece { ws, r0: a, r1: b });
    }
    if items.is_empty() {
        return;
    }
    if pool.n_threads() == 1 || work < POOL_WORK {
        for it in &items {
            let (xs, os) = (
                &x[it.r0 * cols..it.r1 * cols],
                &mut out[it.r0 * rows..it.r1 * rows],
            );
            rows_delta(vk, it, xs, os, cols, rows);
        }
        return;
    }
    let n_rows: usize = items.iter().map(|it| it.r1 - it.r0).sum();
    if n_rows == 1 {
        let it = &items[0];
        let o = &mut out[it.r0 * rows..it.r1 * rows];
        let xs = &x[it.r0 * cols..it.r1 * cols];
        let mut buf = vec![0f32; rows];
        {
            let (so, sb) = (SharedMut::new(o), SharedMut::new(&mut buf));
            pool.run(2, |h| {
                // SAFETY: chunk 0 alone writes the output row, chunk 1 alone
                // the buffer.
                let dst = unsafe {
                    if h == 0 {
                        so.slice(0, rows)
                    } else {
                        sb.slice(0, rows)
                    }
                };
                for &(w, scale) in &it.ws {
                    let (k0, k1) = half(w, h);
                    add_rows(vk, w, scale, xs, dst, k0, k1);
                }
            });
        }
        o.iter_mut().zip(&buf).for_each(|(o, b)| *o += b);
        return;
    }
    // Several rows: pieces of rows, each with all of its segment's pairs.
    let per = n_rows.div_ceil(pool.n_threads() * 2).max(1);
    let mut pieces: Vec<Piece<'_>> = Vec::new();
    for it in items {
        let mut r = it.r0;
        while r < it.r1 {
            let e = (r + per).min(it.r1);
            pieces.push(Piece {
                ws: it.ws.clone(),
                r0: r,
                r1: e,
            });
            r = e;
        }
    }
    let so = SharedMut::new(out);
    pool.run(pieces.len(), |c| {
        let pc = &pieces[c];
        // SAFETY: pieces cover disjoint rows, so chunk c alone owns rows
        // r0..r1 of the output.
        let o = unsafe { so.slice(pc.r0 * rows, (pc.r1 - pc.r0) * rows) };
        rows_delta(vk, pc, &x[pc.r0 * cols..pc.r1 * cols], o, cols, rows);
    });
}

/// `out[t] += scale * B (A x[t])` for every row `t`, over ranks `k0..k1`.
fn add_rows(
    vk: &VecKernels,
    w: &LoraWeight,
    scale: f32,
    x: &[f32],
    out: &mut [f32],
    k0: usize,
    k1: usize,
) {
    let (ni, no) = (w.n_in, w.n_out);
    let lk = kernels::matching(vk);
    let mut t = vec![0f32; k1 - k0];
    for (xr, or) in x.chunks_exact(ni).zip(out.chunks_exact_mut(no)) {
        match &w.a {
            Store::F16(a) => (lk.dots_f16)(xr, &a[k0 * ni..k1 * ni], &mut t),
            Store::F32(a) => (lk.dots_f32)(xr, &a[k0 * ni..k1 * ni], &mut t),
        }
        t.iter_mut().for_each(|v| *v *= scale);
        add_b(vk, &w.bt, &t, k0, no, or);
    }
}

/// `out += sum_j t[j] * Bt[k0 + j]`, with the bits of one axpy per rank.
fn add_b(vk: &VecKernels, bt: &Store, t: &[f32], k0: usize, no: usize, out: &mut [f32]) {
    let rows = k0 * no..(k0 + t.len()) * no;
    match bt {
        Store::F16(b) => (vk.axpy_rows_f16)(out, t, &b[rows]),
        Store::F32(b) => (vk.axpy_rows)(out, t, &b[rows]),
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
                add_b(vk, &w.bt, &t, 0, e, &mut x[i * e..(i + 1) * e]);
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
                add_rows(vk, &w, 0.75, &x, &mut out, 0, 2);
                add_rows(vk, &w, 0.75, &x, &mut out, 2, w.rank);
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
