//! Causal grouped-query attention over the KV cache.
//!
//! The unit of work is one KV head with the group of query heads that share
//! it, so each key and value row is loaded once per query for the whole
//! group. Scores are computed tile by tile into one row per query (never a
//! score matrix), then normalized, and the values are summed with the
//! normalized weights. Normalizing before the value product, rather than
//! rescaling a running sum, is what lets us round the weights to f16 exactly
//! where llama.cpp does with an f16 cache, so our logits match it to the
//! bit wherever its arithmetic is defined.
//!
//! Prefill splits work by KV head and query block. Decode (one query)
//! splits the key range across units in two dispatches (scores, then
//! values), so both threads stay busy even with fewer KV heads than cores.
//! The split depends on the model and context only, never on the thread
//! count, so results are identical for any number of threads.

use crate::model::kv_cache::KvDtype;
use crate::model::kv_cache::{KvCache, KvView};
use crate::model::kv_pool::Rows;
use crate::ops::vec::VecKernels;
use crate::quant::kv as kvq;
use crate::threadpool::{SharedMut, ThreadPool};

const QUERY_BLOCK: usize = 8;
/// Decode work units to aim for (KV heads x key splits).
const DECODE_UNITS: usize = 16;
/// Fewest keys worth a decode split of their own.
const MIN_SPLIT: usize = 64;

/// One pool thread's buffers for `decode_many`'s units, kept between
/// units and steps: a unit allocated its query copy, its scores and its
/// key tile anew, a few thousand allocations a step once several rows
/// (a batch, verification rows) attend, which a profile put at 3% of a
/// four-row verification pass.
#[derive(Default)]
struct UnitBufs {
    q: Vec<f32>,
    scores: Vec<f32>,
    tile: Vec<f32>,
}

thread_local! {
    static UNIT_BUFS: std::cell::RefCell<UnitBufs> = std::cell::RefCell::new(UnitBufs::default());
    /// `weighted_values`' chunk sums (it never runs inside itself).
    static CHUNK_SUMS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub struct AttnParams<'a> {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub dim_k: usize,
    pub dim_v: usize,
    pub scale: f32,
    /// Sliding window: a query at position p sees keys in `(p - w, p]`.
    pub window: Option<usize>,
    /// Scores become `cap * tanh(score / cap)` before the softmax (Gemma 2).
    pub softcap: Option<f32>,
    /// Whether a query sees only earlier keys; an encoder (BERT) sees the
    /// whole block it was evaluated with.
    pub causal: bool,
    /// One learned logit per query head that joins every softmax's
    /// denominator and takes no value (gpt-oss's attention sinks).
    pub sinks: Option<&'a [f32]>,
}

impl AttnParams<'_> {
    fn sink(&self, hq: usize) -> Option<f32> {
        self.sinks.and_then(|s| s.get(hq).copied())
    }
}

/// Rounds queries (back to back, each a multiple of 32 long) as llama.cpp
/// does before its q.k products: to f16 against an f16 key cache, through
/// its Q8_0 activation quantizer against a Q8_0 or Q4_0 one.
fn round_queries(vk: &VecKernels, keys: KvView<'_>, q: &mut [f32]) {
    match keys.dtype() {
        KvDtype::F16 => (vk.scale_round16)(q, 1.0),
        KvDtype::Q8_0 | KvDtype::Q4_0 => kvq::round_through_q8_0(q),
        KvDtype::F32 => {}
    }
}

/// With an f16 value cache the softmax weights are rounded to f16 before
/// the value product, as llama.cpp's f16 matrix products do.
fn rounds(vals: KvView<'_>) -> bool {
    vals.is_f16()
}

/// Keys (or values) processed per tile: converted from f16 once and then
/// used by every query of the unit. Sixteen rows of a 256-wide head are
/// 16 KB as f32, which stays in L1 while the block kernels sweep it once
/// per block of queries; 32 rows did not (pp512 at depth 8192 on Gemma-3:
/// about 630 against 665 tok/s).
const TILE: usize = 16;

/// At most this many queries read an f16 cache's rows as stored, converting
/// them in the registers (a decode step's group of heads); more (a prefill
/// block) convert each tile to f32 once, since every query block would
/// convert the rows again.
const FUSED_QUERIES: usize = 8;
/// ... and only rows this wide: Gemma-3's heads of 256 decoded 3-5% slower
/// so at depth 2048 (one thread, five alternating runs), though the kernels
/// alone, on a tile in L1, were faster.
const FUSED_WIDTH: usize = 128;

/// Whether `n` queries read rows `d` wide from an f16 cache as stored.
fn raw_f16(n: usize, d: usize) -> bool {
    n <= FUSED_QUERIES && d <= FUSED_WIDTH
}

/// A tile of key or value rows as the block kernels take it.
#[derive(Clone, Copy)]
enum Tile<'a> {
    F32(&'a [f32]),
    /// An f16 cache's rows as stored.
    F16(&'a [u16]),
}

impl Tile<'_> {
    fn len(&self) -> usize {
        match self {
            Tile::F32(t) => t.len(),
            Tile::F16(t) => t.len(),
        }
    }
}

/// Calls `f(j0, rows)` for consecutive tiles of rows `lo..hi` of a KV head.
/// Quantized rows, and f16 rows unless `raw_f16`, are converted into `buf`
/// once per tile (so the cache is read as stored and never expanded as a
/// whole); f32 rows, and f16 rows with `raw_f16`, are passed as stored, a
/// page at most. A tile never crosses a KV page. Scores are per key and
/// values are summed in key order, so where tiles end changes no result.
#[allow(clippy::too_many_arguments)]
fn tiles(
    vk: &VecKernels,
    view: KvView<'_>,
    lo: usize,
    hi: usize,
    d: usize,
    buf: &mut Vec<f32>,
    raw_f16: bool,
    mut f: impl FnMut(usize, Tile<'_>),
) {
    // Values read from key rows (MLA) are each row's first `d` elements:
    // not back to back, so they are gathered into the tile.
    let strided = view.strided();
    let direct = strided.is_none()
        && match view.dtype() {
            KvDtype::F32 => true,
            KvDtype::F16 => raw_f16,
            KvDtype::Q8_0 | KvDtype::Q4_0 => false,
        };
    // Sized for the rows actually visited: a short decode range needs a
    // fraction of a tile, and zeroing a whole one per unit showed up.
    let need = if direct {
        0
    } else {
        TILE.min(hi.saturating_sub(lo)) * d
    };
    if buf.len() < need {
        buf.resize(need, 0.0);
    }
    let mut j0 = lo;
    while j0 < hi {
        let j1 = (j0 + TILE).min(hi);
        // Each page is a short stream of its own (2 KB for one head of 64),
        // too short for the hardware prefetcher to find before it ends, and
        // a batched decode step walks the pages of eight sequences: the next
        // tile is asked for while this one is converted and used.
        let (mut j, next_end) = (j1, (j1 + TILE).min(hi));
        while j < next_end {
            let end = next_end.min(view.page_end(j));
            view.rows(j, end).prefetch();
            j = end;
        }
        if direct {
            let end = j1.min(view.page_end(j0));
            match view.rows(j0, end) {
                Rows::F32(x) => f(j0, Tile::F32(x)),
                Rows::F16(x) => f(j0, Tile::F16(x)),
                // `direct` holds for f32 and f16 rows only.
                Rows::Q8_0(_) | Rows::Q4_0(_) => {}
            }
            j0 = end;
        } else {
            // Converted page by page into one tile (pages are 16 rows, as a
            // tile is, but a tile need not start on a page).
            // A quantized row is whole blocks, so a page's rows are too.
            let mut j = j0;
            while j < j1 {
                let end = j1.min(view.page_end(j));
                let dst = &mut buf[(j - j0) * d..(end - j0) * d];
                let rows = view.rows(j, end);
                match strided {
                    None => convert_rows(vk, rows, dst),
                    Some((stride, take)) => {
                        for (r, out) in dst.chunks_exact_mut(d).enumerate() {
                            convert_rows(vk, rows.sub(r * stride, take), out);
                        }
                    }
                }
                j = end;
            }
            f(j0, Tile::F32(&buf[..(j1 - j0) * d]));
            j0 = j1;
        }
    }
}

/// Rows as stored into f32 (`dst` holds exactly their elements).
fn convert_rows(vk: &VecKernels, rows: Rows<'_>, dst: &mut [f32]) {
    match rows {
        Rows::F16(x) => (vk.f16_to_f32)(x, dst),
        Rows::Q8_0(x) => kvq::dequantize_q8_0(x, dst),
        Rows::Q4_0(x) => kvq::dequantize_q4_0(x, dst),
        Rows::F32(x) => dst.copy_from_slice(x),
    }
}

/// The part of `lo..hi` inside the tile that starts at `j0` with `n` rows.
fn overlap(lo: usize, hi: usize, j0: usize, n: usize) -> Option<(usize, usize)> {
    let (a, b) = (lo.max(j0), hi.min(j0 + n));
    (a < b).then_some((a, b))
}

/// Calls `f((i0, i1), (a, b))` for each run of consecutive queries
/// `i0..i1` that see the same rows `a..b` of the tile of `n` rows at `j0`,
/// so a block kernel can serve them together: the group of heads of one
/// token always does, and a whole query block does wherever the tile lies
/// before every query's diagonal and inside every window.
fn for_runs(
    queries: &[Query<'_>],
    j0: usize,
    n: usize,
    mut f: impl FnMut((usize, usize), (usize, usize)),
) {
    let mut i = 0;
    while i < queries.len() {
        let span = overlap(queries[i].lo, queries[i].hi, j0, n);
        let mut e = i + 1;
        while e < queries.len() && overlap(queries[e].lo, queries[e].hi, j0, n) == span {
            e += 1;
        }
        if let Some(ab) = span {
            f((i, e), ab);
        }
        i = e;
    }
}

/// Query `i` of a unit: its (already rounded) vector, the keys it sees, and
/// its score row (indexed from `base`).
struct Query<'a> {
    q: &'a [f32],
    lo: usize,
    hi: usize,
}

/// `rows[i][j - base] = scale * q_i . k_j` for every query and its visible
/// keys; returns nothing: the maxima come later, per query.
#[allow(clippy::too_many_arguments)]
fn scores(
    vk: &VecKernels,
    queries: &[Query<'_>],
    keys: KvView<'_>,
    d: usize,
    (scale, softcap): (f32, Option<f32>),
    base: usize,
    stride: usize,
    rows: &mut [f32],
    buf: &mut Vec<f32>,
) {
    let lo = queries.iter().map(|q| q.lo).min().unwrap_or(0);
    let hi = queries.iter().map(|q| q.hi).max().unwrap_or(0);
    let qs: Vec<&[f32]> = queries.iter().map(|q| q.q).collect();
    let raw_f16 = raw_f16(queries.len(), d);
    tiles(vk, keys, lo, hi, d, buf, raw_f16, |j0, tile| {
        for_runs(queries, j0, tile.len() / d, |(i0, i1), (a, b)| {
            let out = &mut rows[i0 * stride + a - base..];
            let (qs, ab) = (&qs[i0..i1], (a - j0) * d..(b - j0) * d);
            match tile {
                Tile::F32(t) => (vk.dot_block)(qs, &t[ab], out, stride),
                Tile::F16(t) => (vk.dot_block_f16)(qs, &t[ab], out, stride),
            }
        });
    });
    for (i, q) in queries.iter().enumerate() {
        let row = &mut rows[i * stride + q.lo - base..i * stride + q.hi - base];
        row.iter_mut().for_each(|x| *x *= scale);
        if let Some(cap) = softcap {
            // As ggml: scale by 1/cap, tanh, scale by cap.
            let inv = 1.0 / cap;
            row.iter_mut().for_each(|x| *x = (*x * inv).tanh() * cap);
        }
    }
}

/// Keys whose weighted values are summed on their own before they join a
/// query's output: the chunks `[k * VCHUNK, (k + 1) * VCHUNK)` of absolute
/// key positions.
///
/// Why: a decode step splits a long key range across units, each summing
/// its part, and a prefill sums a query's keys in one pass. Summed either
/// way in plain key order, the two outputs differed in their last bits
/// (then, after the activations' 8-bit rounding, by up to 0.8 in a
/// logit), so KV written by a decode differed from a prefill's of the same
/// tokens. With every path adding the same chunk sums, each formed from
/// zero in key order, in chunk order, a query's output has the same bits
/// whether it was decoded alone, in a batch, split across units or
/// prefilled. A decode split is a run of whole chunks.
const VCHUNK: usize = MIN_SPLIT;

/// The chunks (indices) that keys `lo..hi` touch.
fn chunks(lo: usize, hi: usize) -> std::ops::Range<usize> {
    lo / VCHUNK..hi.div_ceil(VCHUNK)
}

/// `acc_i += sum_j w_i[j - base] * v_j` over each query's keys: the keys
/// of each chunk (`VCHUNK`) summed from zero in key order, then added to
/// `acc_i` in chunk order.
#[allow(clippy::too_many_arguments)]
fn weighted_values(
    vk: &VecKernels,
    queries: &[Query<'_>],
    vals: KvView<'_>,
    d: usize,
    base: usize,
    stride: usize,
    weights: &[f32],
    accs: &mut [&mut [f32]],
    buf: &mut Vec<f32>,
) {
    let lo = queries.iter().map(|q| q.lo).min().unwrap_or(0);
    let hi = queries.iter().map(|q| q.hi).max().unwrap_or(0);
    let raw_f16 = raw_f16(queries.len(), d);
    CHUNK_SUMS.with_borrow_mut(|sums| {
        sums.clear();
        sums.resize(queries.len() * d, 0.0);
        chunk_sums(
            vk,
            queries,
            vals,
            d,
            (lo, hi),
            (base, stride),
            weights,
            accs,
            buf,
            raw_f16,
            sums,
        )
    });
}

/// `weighted_values`' loop, with its chunk sums' buffer.
#[allow(clippy::too_many_arguments)]
fn chunk_sums(
    vk: &VecKernels,
    queries: &[Query<'_>],
    vals: KvView<'_>,
    d: usize,
    (lo, hi): (usize, usize),
    (base, stride): (usize, usize),
    weights: &[f32],
    accs: &mut [&mut [f32]],
    buf: &mut Vec<f32>,
    raw_f16: bool,
    sums: &mut [f32],
) {
    let mut parts: Vec<&mut [f32]> = sums.chunks_exact_mut(d).collect();
    for k in chunks(lo, hi) {
        let (c0, c1) = ((k * VCHUNK).max(lo), ((k + 1) * VCHUNK).min(hi));
        parts.iter_mut().for_each(|p| p.fill(0.0));
        tiles(vk, vals, c0, c1, d, buf, raw_f16, |j0, tile| {
            for_runs(queries, j0, tile.len() / d, |(i0, i1), (a, b)| {
                let (w, ys, ab) = (
                    &weights[i0 * stride + a - base..],
                    &mut parts[i0..i1],
                    (a - j0) * d..(b - j0) * d,
                );
                match tile {
                    Tile::F32(t) => (vk.axpy_block)(ys, w, stride, &t[ab]),
                    Tile::F16(t) => (vk.axpy_block_f16)(ys, w, stride, &t[ab]),
                }
            });
        });
        for (q, (acc, part)) in queries.iter().zip(accs.iter_mut().zip(&parts)) {
            if q.lo < c1 && c0 < q.hi {
                acc.iter_mut().zip(part.iter()).for_each(|(x, y)| *x += y);
            }
        }
    }
}

/// Turns scores into normalized weights in place (`exp(s - max) / sum`,
/// the sum accumulated in f64 as ggml does), rounded to f16 when asked.
fn normalize(vk: &VecKernels, s: &mut [f32], sum: f64, round: bool) {
    let inv = (1.0 / sum) as f32;
    if round {
        (vk.scale_round16)(s, inv);
    } else {
        s.iter_mut().for_each(|x| *x *= inv);
    }
}

/// The largest score of a row (or of a row's per-split maxima).
fn row_max(s: &[f32]) -> f32 {
    s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x))
}

/// Scores to weights in place, given the row's maximum: the one softmax
/// every attention path uses, so they all round alike.
/// A sink joins the maximum and the sum as ggml's `soft_max` with sinks
/// has it: `exp(sink - max)`, added to the f64 sum last.
fn softmax(vk: &VecKernels, s: &mut [f32], max: f32, round: bool, sink: Option<f32>) {
    let max = sink.map_or(max, |k| max.max(k));
    let mut sum = exp_sum(vk, s, max);
    if let Some(k) = sink {
        sum += (k - max).exp() as f64;
    }
    normalize(vk, s, sum, round);
}

/// `s = exp(s - max)`, returning the sum in key order, in f64.
fn exp_sum(vk: &VecKernels, s: &mut [f32], max: f32) -> f64 {
    (vk.exp_shifted)(s, max);
    s.iter().fold(0f64, |a, &x| a + x as f64)
}

/// Keys `lo..hi` a query at `pos` attends to, in a block ending at `end`.
fn visible(p: &AttnParams, pos: usize, end: usize) -> (usize, usize) {
    let hi = if p.causal { pos + 1 } else { end };
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
    if n_tok == 1 {
        decode(pool, vk, cache, layer, q, pos0, p, out);
        return;
    }
    let group = p.n_head / p.n_head_kv;
    let kv_len = pos0 + n_tok;
    let q_stride = p.n_head * p.dim_k;
    let o_stride = p.n_head * p.dim_v;
    let shared_out = SharedMut::new(out);
    let n_qblk = n_tok.div_ceil(QUERY_BLOCK);
    pool.run(p.n_head_kv * n_qblk, |u| {
        let (g, qb) = (u / n_qblk, u % n_qblk);
        let keys = cache.keys(layer, g, kv_len);
        let vals = cache.values(layer, g, kv_len);
        let round = rounds(vals);
        let (t0, t1) = (qb * QUERY_BLOCK, ((qb + 1) * QUERY_BLOCK).min(n_tok));
        // Every (token, head) of the block and group, token-major.
        let heads = g * group..(g + 1) * group;
        let mut qbuf = Vec::with_capacity((t1 - t0) * group * p.dim_k);
        for t in t0..t1 {
            for hq in heads.clone() {
                let qo = t * q_stride + hq * p.dim_k;
                qbuf.extend_from_slice(&q[qo..qo + p.dim_k]);
            }
        }
        round_queries(vk, keys, &mut qbuf);
        let queries: Vec<Query<'_>> = (t0..t1)
            .flat_map(|t| std::iter::repeat_n(t, group))
            .zip(qbuf.chunks_exact(p.dim_k))
            .map(|(t, qv)| {
                let (lo, hi) = visible(p, pos0 + t, kv_len);
                Query { q: qv, lo, hi }
            })
            .collect();
        let base = queries.iter().map(|q| q.lo).min().unwrap_or(0);
        let stride = queries.iter().map(|q| q.hi).max().unwrap_or(0) - base;
        let mut rows = vec![0f32; queries.len() * stride];
        let mut tile = Vec::new();
        scores(
            vk,
            &queries,
            keys,
            p.dim_k,
            (p.scale, p.softcap),
            base,
            stride,
            &mut rows,
            &mut tile,
        );
        for (i, qr) in queries.iter().enumerate() {
            let s = &mut rows[i * stride + qr.lo - base..i * stride + qr.hi - base];
            softmax(vk, s, row_max(s), round, p.sink(g * group + i % group));
        }
        let mut accs: Vec<&mut [f32]> = (t0..t1)
            .flat_map(|t| heads.clone().map(move |hq| (t, hq)))
            .map(|(t, hq)| {
                // SAFETY: (t, hq) belongs to exactly one unit (g = hq / group,
                // qb = t / QUERY_BLOCK).
                let o = unsafe { shared_out.slice(t * o_stride + hq * p.dim_v, p.dim_v) };
                o.fill(0.0);
                o
            })
            .collect();
        weighted_values(
            vk, &queries, vals, p.dim_v, base, stride, &rows, &mut accs, &mut tile,
        );
    });
}

#[allow(clippy::too_many_arguments)]
fn decode(
    pool: &ThreadPool,
    vk: &VecKernels,
    cache: &KvCache,
    layer: usize,
    q: &[f32],
    pos: usize,
    p: &AttnParams,
    out: &mut [f32],
) {
    decode_many(pool, vk, layer, p, &mut [DecodeRow { cache, q, pos, out }]);
}

/// A split row's KV head in one unit: the scores of the whole span
/// (`scores`, one row per head of the group) go through the row's softmax,
/// then the values are summed chunk by chunk (`weighted_values`), the
/// bits of the split units' path.
#[allow(clippy::too_many_arguments)]
fn whole_split_row<'o>(
    vk: &VecKernels,
    pl: &Plan,
    vals: KvView<'_>,
    round: bool,
    d: usize,
    scores: &mut [f32],
    tile: &mut Vec<f32>,
    out: impl Fn(usize) -> &'o mut [f32],
    sinks: impl Fn(usize) -> Option<f32>,
) {
    for (gi, row) in scores.chunks_exact_mut(pl.span).enumerate() {
        softmax(vk, row, row_max(row), round, sinks(gi));
    }
    let group = scores.len() / pl.span;
    let queries: Vec<Query<'_>> = (0..group)
        .map(|_| Query {
            q: &[],
            lo: pl.lo,
            hi: pl.lo + pl.span,
        })
        .collect();
    let mut accs: Vec<&mut [f32]> = (0..group)
        .map(|gi| {
            let o = out(gi);
            o.fill(0.0);
            o
        })
        .collect();
    weighted_values(
        vk, &queries, vals, d, pl.lo, pl.span, scores, &mut accs, tile,
    );
}

/// Split `s` of a row's values for the heads of one KV group: for each
/// chunk `c` of the split, `accs[c][gi]` (zeroed) gets that chunk's keys
/// weighted by head gi's row of `weights` (`group x span`, from the row's
/// first key), as `weighted_values` forms a chunk's sum.
#[allow(clippy::too_many_arguments)]
fn split_values(
    vk: &VecKernels,
    pl: &Plan,
    s: usize,
    vals: KvView<'_>,
    d: usize,
    weights: &[f32],
    accs: &mut [Vec<&mut [f32]>],
    tile: &mut Vec<f32>,
) {
    let (a, b) = pl.range(s);
    if a >= b {
        return;
    }
    for (c, k) in chunks(a, b).enumerate() {
        let (c0, c1) = ((k * VCHUNK).max(a), ((k + 1) * VCHUNK).min(b));
        let queries: Vec<Query<'_>> = (0..accs[c].len())
            .map(|_| Query {
                q: &[],
                lo: c0,
                hi: c1,
            })
            .collect();
        weighted_values(
            vk,
            &queries,
            vals,
            d,
            pl.lo,
            pl.span,
            weights,
            &mut accs[c],
            tile,
        );
    }
}

/// One single-token query: a sequence's cache, its query (`n_head x
/// dim_k`, post-RoPE), its position, and where its output goes.
pub struct DecodeRow<'a> {
    pub cache: &'a KvCache,
    pub q: &'a [f32],
    pub pos: usize,
    pub out: &'a mut [f32],
}

/// The inputs of a `DecodeRow`, without its output.
struct RowView<'a> {
    cache: &'a KvCache,
    q: &'a [f32],
    pos: usize,
}

impl<'a> RowView<'a> {
    fn of(r: &DecodeRow<'a>) -> Self {
        RowView {
            cache: r.cache,
            q: r.q,
            pos: r.pos,
        }
    }
}

/// Per-row plan: how the key range is split into work units, each a run
/// of whole value chunks (`VCHUNK`).
struct Plan {
    lo: usize,
    span: usize,
    n_split: usize,
    /// The first value chunk the keys touch, and how many they touch.
    k0: usize,
    n_chunks: usize,
    /// Chunks per split (the last split may have fewer, or none).
    per: usize,
    /// Units per KV head: `n_split`, or 1 where one unit does every split.
    units: usize,
    /// First global unit index of this row.
    first: usize,
}

impl Plan {
    fn new(lo: usize, hi: usize, n_head_kv: usize, units_of: impl Fn(usize) -> usize) -> Self {
        let ks = chunks(lo, hi);
        let n_chunks = ks.len();
        let n_split = DECODE_UNITS.div_ceil(n_head_kv).min(n_chunks).max(1);
        Plan {
            lo,
            span: hi - lo,
            n_split,
            k0: ks.start,
            n_chunks,
            per: n_chunks.div_ceil(n_split),
            units: units_of(n_split),
            first: 0,
        }
    }

    /// Keys of split `s`: its chunks' part of `lo..lo + span`.
    fn range(&self, s: usize) -> (usize, usize) {
        let hi = self.lo + self.span;
        let a = ((self.k0 + s * self.per) * VCHUNK).max(self.lo).min(hi);
        let b = ((self.k0 + (s + 1) * self.per) * VCHUNK).min(hi);
        (a, b.max(a))
    }

    /// Index (from the row's first chunk) of split `s`'s first chunk.
    fn first_chunk(&self, s: usize) -> usize {
        (s * self.per).min(self.n_chunks)
    }
}

/// Single-token attention for many sequences at once (a batched decode
/// step). Each row is split exactly as a lone decode would split it, so
/// results are identical to calling `attention` row by row.
///
/// A row whose keys fit one split (short contexts: most of a serving
/// batch) is done start to finish by the units of its KV heads in the first
/// dispatch: scores, softmax, values, straight into its output. Rows split
/// across units take three more steps: their softmax, one unit per (row,
/// head); their values per split; then a fixed-order sum of the splits.
/// Either way every weight and sum is formed in the same order.
///
/// Where the (row, KV head) pairs alone give every thread a unit, each
/// split row's steps run in one unit per KV head instead, splits and all,
/// in the one dispatch: the same arithmetic, without two more dispatches
/// and a serial sum. On two threads that took eight SmolLM2 rows 0.92x
/// the step, and one row at depth 400 (three KV heads: one thread does
/// two) 0.90x. Below that (SmolLM2 on 16 threads, Gemma-3's one KV head)
/// the splits' own units keep the threads busy.
pub fn decode_many(
    pool: &ThreadPool,
    vk: &VecKernels,
    layer: usize,
    p: &AttnParams,
    rows: &mut [DecodeRow<'_>],
) {
    let whole = rows.len() * p.n_head_kv >= pool.n_threads();
    decode_rows(pool, vk, layer, p, rows, whole);
}

/// `decode_many`, with `whole` saying whether each split row is done by one
/// unit per KV head (the same bits either way).
fn decode_rows(
    pool: &ThreadPool,
    vk: &VecKernels,
    layer: usize,
    p: &AttnParams,
    rows: &mut [DecodeRow<'_>],
    whole: bool,
) {
    let group = p.n_head / p.n_head_kv;
    let mut plans = Vec::with_capacity(rows.len());
    let mut total = 0;
    for r in rows.iter() {
        let (lo, hi) = visible(p, r.pos, r.pos + 1);
        let mut plan = Plan::new(lo, hi, p.n_head_kv, |n| if whole { 1 } else { n });
        plan.first = total;
        total += p.n_head_kv * plan.units;
        plans.push(plan);
    }
    // Global unit -> (row, unit within the row).
    let locate = |u: usize| {
        let i = plans.partition_point(|pl| pl.first <= u) - 1;
        (i, u - plans[i].first)
    };
    // Rows whose splits take units of their own (and the later steps).
    let split = |i: usize| plans[i].units > 1;

    // Scores of split rows, and their per-split maxima (empty otherwise).
    let mut alls: Vec<Vec<f32>> = plans
        .iter()
        .map(|pl| vec![0f32; if pl.units > 1 { p.n_head * pl.span } else { 0 }])
        .collect();
    let mut maxes: Vec<Vec<f32>> = plans
        .iter()
        .map(|pl| {
            vec![
                f32::NEG_INFINITY;
                if pl.units > 1 {
                    p.n_head * pl.n_split
                } else {
                    0
                }
            ]
        })
        .collect();
    {
        let shs: Vec<SharedMut<f32>> = alls.iter_mut().map(|a| SharedMut::new(a)).collect();
        let mxs: Vec<SharedMut<f32>> = maxes.iter_mut().map(|m| SharedMut::new(m)).collect();
        // The read-only parts of each row, copied out so that its output
        // can be handed to the units without aliasing a shared borrow.
        let views: Vec<RowView<'_>> = rows.iter().map(RowView::of).collect();
        let outs: Vec<SharedMut<f32>> = rows.iter_mut().map(|r| SharedMut::new(r.out)).collect();
        pool.run(total, |gu| {
            let (i, u) = locate(gu);
            let (pl, r) = (&plans[i], &views[i]);
            let (g, s) = (u / pl.units, u % pl.units);
            let (a, b) = if pl.units == 1 {
                (pl.lo, pl.lo + pl.span)
            } else {
                pl.range(s)
            };
            if a >= b {
                return;
            }
            let keys = r.cache.keys(layer, g, r.pos + 1);
            let round = rounds(r.cache.values(layer, g, r.pos + 1));
            UNIT_BUFS.with_borrow_mut(|ub| {
                let UnitBufs {
                    q: qbuf,
                    scores: local,
                    tile,
                } = ub;
                qbuf.clear();
                qbuf.extend_from_slice(&r.q[g * group * p.dim_k..(g + 1) * group * p.dim_k]);
                round_queries(vk, keys, qbuf);
                let queries: Vec<Query<'_>> = qbuf
                    .chunks_exact(p.dim_k)
                    .map(|qv| Query {
                        q: qv,
                        lo: a,
                        hi: b,
                    })
                    .collect();
                // Every score is written by `scores` before it is read.
                local.resize(group * (b - a), 0.0);
                let local = &mut local[..group * (b - a)];
                scores(
                    vk,
                    &queries,
                    keys,
                    p.dim_k,
                    (p.scale, p.softcap),
                    a,
                    b - a,
                    local,
                    tile,
                );
                if pl.n_split > 1 && pl.units == 1 {
                    // SAFETY: this unit alone covers the heads of group g of
                    // row i (one unit per KV head).
                    let out =
                        |gi: usize| unsafe { outs[i].slice((g * group + gi) * p.dim_v, p.dim_v) };
                    whole_split_row(
                        vk,
                        pl,
                        r.cache.values(layer, g, r.pos + 1),
                        round,
                        p.dim_v,
                        local,
                        tile,
                        out,
                        |gi| p.sink(g * group + gi),
                    );
                    return;
                }
                if !split(i) {
                    for (gi, row) in local.chunks_exact_mut(b - a).enumerate() {
                        softmax(vk, row, row_max(row), round, p.sink(g * group + gi));
                    }
                    let mut accs: Vec<&mut [f32]> = (0..group)
                        .map(|gi| {
                            // SAFETY: this unit alone covers the heads of group g
                            // of row i (the row has one split).
                            let o = unsafe { outs[i].slice((g * group + gi) * p.dim_v, p.dim_v) };
                            o.fill(0.0);
                            o
                        })
                        .collect();
                    let vals = r.cache.values(layer, g, r.pos + 1);
                    weighted_values(
                        vk,
                        &queries,
                        vals,
                        p.dim_v,
                        a,
                        b - a,
                        local,
                        &mut accs,
                        tile,
                    );
                    return;
                }
                for (gi, src) in local.chunks_exact(b - a).enumerate() {
                    let hq = g * group + gi;
                    // SAFETY: unit (i, g, s) owns keys a..b of the heads of group
                    // g in row i, and slot (hq, s) of that row's maxima.
                    unsafe {
                        shs[i]
                            .slice(hq * pl.span + (a - pl.lo), b - a)
                            .copy_from_slice(src);
                        mxs[i].slice(hq * pl.n_split + s, 1)[0] = row_max(src);
                    }
                }
            });
        });
    }
    let split_rows: Vec<usize> = (0..rows.len()).filter(|&i| split(i)).collect();
    if split_rows.is_empty() {
        return;
    }
    // Softmax of each split row's heads (one exp per key), one unit each.
    {
        let shs: Vec<SharedMut<f32>> = alls.iter_mut().map(|a| SharedMut::new(a)).collect();
        let (rows_ref, maxes) = (&*rows, &maxes);
        pool.run(split_rows.len() * p.n_head, |u| {
            let (i, hq) = (split_rows[u / p.n_head], u % p.n_head);
            let pl = &plans[i];
            let round = rounds(rows_ref[i].cache.values(layer, 0, rows_ref[i].pos + 1));
            let m = row_max(&maxes[i][hq * pl.n_split..(hq + 1) * pl.n_split]);
            // SAFETY: unit (i, hq) alone owns head hq's scores of row i.
            let row = unsafe { shs[i].slice(hq * pl.span, pl.span) };
            softmax(vk, row, m, round, p.sink(hq));
        });
    }
    // Weighted values per split, each chunk's sum apart, then each head's
    // chunk sums added in chunk order (as `weighted_values` adds them).
    let firsts: Vec<usize> = split_rows
        .iter()
        .scan(0, |n, &i| {
            let f = *n;
            *n += p.n_head_kv * plans[i].n_split;
            Some(f)
        })
        .collect();
    let n_units = firsts.last().map_or(0, |&f| {
        f + p.n_head_kv * plans[split_rows[split_rows.len() - 1]].n_split
    });
    // Chunk slots: per split row, per KV head, per chunk (group x dim_v).
    let slot_firsts: Vec<usize> = split_rows
        .iter()
        .scan(0, |n, &i| {
            let f = *n;
            *n += p.n_head_kv * plans[i].n_chunks;
            Some(f)
        })
        .collect();
    let n_slots = slot_firsts.last().map_or(0, |&f| {
        f + p.n_head_kv * plans[split_rows[split_rows.len() - 1]].n_chunks
    });
    let mut sums = vec![0f32; n_slots * group * p.dim_v];
    {
        let ss = SharedMut::new(&mut sums);
        let (alls, rows_ref) = (&alls, &*rows);
        pool.run(n_units, |gu| {
            let k = firsts.partition_point(|&f| f <= gu) - 1;
            let (i, u) = (split_rows[k], gu - firsts[k]);
            let (pl, r) = (&plans[i], &rows_ref[i]);
            let (g, s) = (u / pl.n_split, u % pl.n_split);
            let vals = r.cache.values(layer, g, r.pos + 1);
            let slot = |c: usize| slot_firsts[k] + g * pl.n_chunks + c;
            let mut accs: Vec<Vec<&mut [f32]>> = (pl.first_chunk(s)..pl.first_chunk(s + 1))
                .map(|c| {
                    (0..group)
                        // SAFETY: unit (row k, head g, split s) alone owns
                        // the slots of split s's chunks of head g.
                        .map(|gi| unsafe { ss.slice((slot(c) * group + gi) * p.dim_v, p.dim_v) })
                        .collect()
                })
                .collect();
            let weights = &alls[i][g * group * pl.span..(g + 1) * group * pl.span];
            UNIT_BUFS.with_borrow_mut(|ub| {
                split_values(vk, pl, s, vals, p.dim_v, weights, &mut accs, &mut ub.tile);
            });
        });
    }
    for (k, &i) in split_rows.iter().enumerate() {
        let (pl, r) = (&plans[i], &mut rows[i]);
        for g in 0..p.n_head_kv {
            for gi in 0..group {
                let hq = g * group + gi;
                let o = &mut r.out[hq * p.dim_v..(hq + 1) * p.dim_v];
                o.iter_mut().for_each(|x| *x = 0.0);
                for c in 0..pl.n_chunks {
                    let at = ((slot_firsts[k] + g * pl.n_chunks + c) * group + gi) * p.dim_v;
                    o.iter_mut()
                        .zip(&sums[at..at + p.dim_v])
                        .for_each(|(x, y)| *x += y);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kv_cache::KvDtype;
    use crate::ops::vec;
    use rand::{Rng, SeedableRng};

    /// Naive softmax attention, the oracle; a sink adds `exp(sink)` to the
    /// denominator only.
    fn reference(
        q: &[f32],
        ks: &[Vec<f32>],
        vs: &[Vec<f32>],
        scale: f32,
        sink: Option<f32>,
    ) -> Vec<f32> {
        let s: Vec<f32> = ks
            .iter()
            .map(|k| k.iter().zip(q).map(|(a, b)| a * b).sum::<f32>() * scale)
            .collect();
        let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f32 = w.iter().sum::<f32>() + sink.map_or(0.0, |k| (k - m).exp());
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
                     // Sinks on either side of the scores' range, so both bite.
        let sink_logits: Vec<f32> = (0..n_head).map(|h| h as f32 - 2.5).collect();
        for (dtype, sinks) in [
            (KvDtype::F32, None),
            (KvDtype::F16, None),
            (KvDtype::F32, Some(&sink_logits[..])),
        ] {
            for threads in [1, 2, 3] {
                let pool = ThreadPool::new(threads);
                let mut cache = KvCache::new(dtype, 1, 256, n_kv, d, d).unwrap();
                cache.reserve(0, n).unwrap();
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
                    softcap: None,
                    causal: true,
                    sinks,
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
                        let sink = sinks.map(|k| k[h]);
                        let want =
                            reference(&q[qo..qo + d], &ks[g][..=t], &vs[g][..=t], 0.25, sink);
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

    /// A Q8_0 or Q4_0 cache attends as an f32 cache holding its rows
    /// dequantized would, with each query rounded through Q8_0 first (what
    /// llama.cpp's dot products against quantized keys see).
    #[test]
    fn quantized_caches_attend_over_their_blocks() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let (n_head, n_kv, d) = (4, 2, 64);
        let n = 70;
        let p = AttnParams {
            n_head,
            n_head_kv: n_kv,
            dim_k: d,
            dim_v: d,
            scale: 0.125,
            window: None,
            softcap: None,
            causal: true,
            sinks: None,
        };
        let pool = ThreadPool::new(2);
        for dtype in [KvDtype::Q8_0, KvDtype::Q4_0] {
            let mut cache = KvCache::new(dtype, 1, 128, n_kv, d, d).unwrap();
            let mut plain = KvCache::new(KvDtype::F32, 1, 128, n_kv, d, d).unwrap();
            cache.reserve(0, n).unwrap();
            plain.reserve(0, n).unwrap();
            let round = |x: &[f32]| {
                let mut b = vec![0u8; dtype.row_bytes(x.len())];
                let mut y = vec![0f32; x.len()];
                if dtype == KvDtype::Q8_0 {
                    kvq::quantize_q8_0(x, &mut b);
                    kvq::dequantize_q8_0(&b, &mut y);
                } else {
                    kvq::quantize_q4_0(x, &mut b);
                    kvq::dequantize_q4_0(&b, &mut y);
                }
                y
            };
            for pos in 0..n {
                let k: Vec<f32> = (0..n_kv * d).map(|_| rng.random_range(-2.0..2.0)).collect();
                let v: Vec<f32> = (0..n_kv * d).map(|_| rng.random_range(-2.0..2.0)).collect();
                cache.store(0, pos, &k, &v);
                plain.store(0, pos, &round(&k), &round(&v));
            }
            let q: Vec<f32> = (0..n * n_head * d)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let mut q_rounded = q.clone();
            kvq::round_through_q8_0(&mut q_rounded);
            let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
            let run = |c: &KvCache, q: &[f32], out: &mut [f32]| {
                // Prefill of all but the last position, then a decode.
                let m = (n - 1) * n_head * d;
                attention(
                    &pool,
                    vec::best(),
                    c,
                    0,
                    &q[..m],
                    0,
                    n - 1,
                    &p,
                    &mut out[..m],
                );
                attention(
                    &pool,
                    vec::best(),
                    c,
                    0,
                    &q[m..],
                    n - 1,
                    1,
                    &p,
                    &mut out[m..],
                );
            };
            run(&cache, &q, &mut a);
            run(&plain, &q_rounded, &mut b);
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!((x - y).abs() < 1e-5, "{dtype:?} at {i}: {x} vs {y}");
            }
        }
    }

    /// A batched decode of rows from three sequences (different lengths, one
    /// of them sharing pages with another through a fork) equals decoding
    /// each row alone, bit for bit.
    #[test]
    fn batched_decode_equals_row_by_row() {
        use crate::model::kv_pool::KvPool;
        use std::sync::Arc;
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let (n_head, n_kv, d) = (6, 2, 16);
        let sink_logits: Vec<f32> = (0..n_head).map(|h| 0.5 * h as f32 - 1.0).collect();
        for (dtype, sinks) in [
            (KvDtype::F16, None),
            (KvDtype::F32, None),
            (KvDtype::F16, Some(&sink_logits[..])),
        ] {
            let p = AttnParams {
                n_head,
                n_head_kv: n_kv,
                dim_k: d,
                dim_v: d,
                scale: 0.3,
                window: None,
                softcap: None,
                causal: true,
                sinks,
            };
            let kvp = Arc::new(KvPool::new(dtype, 1, 64, n_kv, d, d).unwrap());
            let mut fill = |c: &mut KvCache, from: usize, to: usize| {
                c.reserve(from, to).unwrap();
                for pos in from..to {
                    let k: Vec<f32> = (0..n_kv * d).map(|_| rng.random_range(-1.0..1.0)).collect();
                    let v: Vec<f32> = (0..n_kv * d).map(|_| rng.random_range(-1.0..1.0)).collect();
                    c.store(0, pos, &k, &v);
                }
            };
            let mut a = KvCache::with_pool(Arc::clone(&kvp), 512);
            fill(&mut a, 0, 300);
            let mut b = a.fork(200).unwrap();
            fill(&mut b, 200, 231);
            let mut c = KvCache::with_pool(Arc::clone(&kvp), 512);
            fill(&mut c, 0, 7);
            let cases: [(&KvCache, usize); 3] = [(&a, 299), (&b, 230), (&c, 6)];
            let qs: Vec<Vec<f32>> = (0..3)
                .map(|_| {
                    (0..n_head * d)
                        .map(|_| rng.random_range(-1.0..1.0))
                        .collect()
                })
                .collect();
            for threads in [1, 2, 3] {
                let pool = ThreadPool::new(threads);
                let mut alone = vec![vec![0f32; n_head * d]; 3];
                for (i, (cache, pos)) in cases.iter().enumerate() {
                    attention(
                        &pool,
                        vec::best(),
                        cache,
                        0,
                        &qs[i],
                        *pos,
                        1,
                        &p,
                        &mut alone[i],
                    );
                }
                // Split rows by units of their own, and each by one unit
                // per KV head (`decode_many` picks by the batch's size).
                for whole in [false, true] {
                    let mut outs = vec![vec![0f32; n_head * d]; 3];
                    let mut rows: Vec<DecodeRow<'_>> = outs
                        .iter_mut()
                        .zip(cases.iter().zip(&qs))
                        .map(|(out, ((cache, pos), q))| DecodeRow {
                            cache,
                            q,
                            pos: *pos,
                            out,
                        })
                        .collect();
                    decode_rows(&pool, vec::best(), 0, &p, &mut rows, whole);
                    assert_eq!(outs, alone, "{dtype:?}, {threads} threads, whole {whole}");
                }
            }
        }
    }

    /// A cache that reads its values from the key rows (MLA) attends as a
    /// cache storing the same prefix as values: bit for bit in f32, to f16
    /// rounding of the weights in f16 (one path converts the rows first),
    /// prefill and decode alike, and it stores no value bytes.
    #[test]
    fn values_read_from_key_rows_equal_stored_values() {
        use crate::model::kv_cache::KvShape;
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let (n_head, dk, dv, n) = (4, 96, 64, 70);
        for (dtype, tol) in [(KvDtype::F32, 0.0), (KvDtype::F16, 2e-3)] {
            let mut plain = KvCache::new(dtype, 1, 128, 1, dk, dv).unwrap();
            let shape = KvShape {
                v_in_k: true,
                ..KvShape::plain(1, 1, dk, dv)
            };
            let mut latent = KvCache::for_shape(dtype, shape, 128).unwrap();
            assert!(latent.v_in_k());
            plain.reserve(0, n).unwrap();
            latent.reserve(0, n).unwrap();
            for pos in 0..n {
                let k: Vec<f32> = (0..dk).map(|_| rng.random_range(-1.0..1.0)).collect();
                plain.store(0, pos, &k, &k[..dv]);
                latent.store(0, pos, &k, &[]);
            }
            let t = ThreadPool::new(2);
            assert_eq!(latent.export_len(n), n * dtype.row_bytes(dk));
            assert_eq!(
                latent.export(n, &t).unwrap(),
                plain.export(n, &t).unwrap()[..n * dtype.row_bytes(dk)]
            );
            let q: Vec<f32> = (0..n * n_head * dk)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let p = AttnParams {
                n_head,
                n_head_kv: 1,
                dim_k: dk,
                dim_v: dv,
                scale: 0.1,
                window: None,
                softcap: None,
                causal: true,
                sinks: None,
            };
            let run = |cache: &KvCache| {
                let mut pre = vec![0f32; (n - 1) * n_head * dv];
                attention(
                    &t,
                    vec::best(),
                    cache,
                    0,
                    &q[..(n - 1) * n_head * dk],
                    0,
                    n - 1,
                    &p,
                    &mut pre,
                );
                let mut dec = vec![0f32; n_head * dv];
                attention(
                    &t,
                    vec::best(),
                    cache,
                    0,
                    &q[(n - 1) * n_head * dk..],
                    n - 1,
                    1,
                    &p,
                    &mut dec,
                );
                pre.extend(dec);
                pre
            };
            let (a, b) = (run(&plain), run(&latent));
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!((x - y).abs() <= tol, "{dtype:?} [{i}]: {x} vs {y}");
            }
        }
    }
}
