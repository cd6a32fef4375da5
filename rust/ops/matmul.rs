//! Quantized matrix products over the worker pool.
//!
//! Activations are quantized once per product into the weight format's
//! integer partner, then every thread claims blocks of weight rows and
//! computes those rows for all tokens, so each weight byte is read from
//! memory once per call whatever the token count (prefill is a GEMM, not
//! one matrix-vector product per token). Several matrices that read the
//! same input (q/k/v, gate/up) go in a single dispatch.

use crate::quant::{
    gemm_reads_packed, gemm_reads_rows, has_panels, kernels, pack_panel, packed_gemm,
    packed_gemm_runs, packed_side, packed_tile, panel_sizes, tile_tokens, unpack_rows, BlockSide,
    GgmlType, QuantKernels, GEMM_COLS, PACKED_GROUP_ROWS, PACKED_TOKENS,
};
use std::sync::Arc;

use crate::gguf::GgufFile;
use crate::threadpool::{SharedMut, ThreadPool};
use crate::{Error, Result};

mod owned;

/// A row-major weight matrix inside the mapped model file.
#[derive(Clone, Copy)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    /// The decode layout of the same matrix, where the kernels repacked it
    /// (`quant::pack_matrix`).
    pub packed: Option<&'a [u8]>,
}

impl<'a> QMatrix<'a> {
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self> {
        let rb = ty.row_bytes(cols).ok_or_else(|| {
            Error::load(format!("{} rows of {cols} are not whole blocks", ty.name()))
        })?;
        if rb.checked_mul(rows) != Some(data.len()) {
            return Err(Error::load(format!(
                "{} matrix {rows}x{cols} needs {} bytes, has {}",
                ty.name(),
                rb.saturating_mul(rows),
                data.len()
            )));
        }
        if kernels(ty).is_none() {
            return Err(Error::load(format!(
                "no matrix kernel for {} weights",
                ty.name()
            )));
        }
        Ok(QMatrix {
            ty,
            rows,
            cols,
            data,
            packed: None,
        })
    }

    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }

    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// Quantized activations of one format, as rows and as GEMM panels.
struct ActBuf {
    ty: GgmlType,
    rows: Vec<u8>,
    /// Panels of GEMM_COLS tokens each, `panel_sizes(ty, cols).0` bytes
    /// apiece.
    panels: Vec<u8>,
    /// Their block scales, `panel_sizes(ty, cols).1` floats apiece.
    panel_scales: Vec<f32>,
}

/// Reusable buffers for quantized activations, one per activation format.
#[derive(Default)]
pub struct ActScratch {
    bufs: Vec<ActBuf>,
    sides: Sides,
    owned: owned::OwnedProducts,
}

impl ActScratch {
    /// The matrices of later products lie in `file`: a decode step's
    /// products may then run as owned jobs, which never wait for a
    /// preempted worker (see `owned`).
    pub fn set_file(&mut self, file: &Arc<GgufFile>) {
        self.owned.set_file(file);
    }

    fn buf(&mut self, ty: GgmlType) -> &mut ActBuf {
        let i = match self.bufs.iter().position(|b| b.ty == ty) {
            Some(i) => i,
            None => {
                self.bufs.push(ActBuf {
                    ty,
                    rows: Vec::new(),
                    panels: Vec::new(),
                    panel_scales: Vec::new(),
                });
                self.bufs.len() - 1
            }
        };
        &mut self.bufs[i]
    }
}

/// The packed kernels' activation-block scalars of one product, per weight
/// format (`quant::packed_side`).
type Sides = Vec<(GgmlType, Vec<BlockSide>)>;

/// Fills the side table of each packed weight format among `ws` (`ks`
/// their kernels) from `act_rows(ty)`, the quantized rows of activation
/// format `ty`. Every format that `side` is asked for in this product is
/// refilled here: a table left from an earlier product is never read.
fn fill_sides<'r>(
    sides: &mut Sides,
    ws: &[QMatrix<'_>],
    ks: &[&QuantKernels],
    act_rows: impl Fn(GgmlType) -> &'r [&'r [u8]],
) {
    let mut filled: Vec<GgmlType> = Vec::new();
    for (w, k) in ws.iter().zip(ks) {
        if w.packed.is_none() || filled.contains(&w.ty) {
            continue;
        }
        filled.push(w.ty);
        let i = match sides.iter().position(|(t, _)| *t == w.ty) {
            Some(i) => i,
            None => {
                sides.push((w.ty, Vec::new()));
                sides.len() - 1
            }
        };
        packed_side(w.ty, w.cols, act_rows(k.act), &mut sides[i].1);
    }
}

/// The table `fill_sides` filled for weight format `ty`.
fn side(sides: &Sides, ty: GgmlType) -> &[BlockSide] {
    sides
        .iter()
        .find(|(t, _)| *t == ty)
        .map_or(&[], |(_, v)| v.as_slice())
}

thread_local! {
    /// Each thread's tile output of the batched (tile) path.
    static TILE_OUT: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Each thread's rows of a packed matrix back in the file's layout, for
    /// the GEMM (`gemm_reads_packed`).
    static UNPACKED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows per chunk are a multiple of this: the AVX-512 VNNI tile takes
/// sixteen rows at a time (the AVX2 tile four).
const ROW_TILE: usize = 16;
/// The most rows one chunk of a product takes.
const MAX_CHUNK_ROWS: usize = 1024;
const _: () = assert!(ROW_TILE.is_multiple_of(PACKED_GROUP_ROWS));

/// Panel bytes handed to one GEMM call (see `matmul_multi`): a quarter
/// of the smallest L2 among the CPUs this runs on (512 KiB).
const PANELS_PER_CALL_BYTES: usize = 128 * 1024;

/// Activation bytes handed to one call of a GEMM that reads the rows
/// (each weight row group is decoded once per call, so the more tokens the
/// better, as long as they stay near the core: the L2 of the CPUs this
/// runs on is 512 KiB to 2 MiB), and the bounds on its token count.
const ROWS_PER_CALL_BYTES: usize = 512 * 1024;
const ROWS_PER_CALL_TOKENS: (usize, usize) = (32, 256);

fn quantize_inputs(
    pool: &ThreadPool,
    k: &QuantKernels,
    x: &[f32],
    cols: usize,
    n_tok: usize,
    dst: &mut Vec<u8>,
) {
    let arb = k.act.row_bytes(cols).unwrap_or(0);
    dst.resize(arb * n_tok, 0);
    // A batched decode step quantizes a few rows: cheaper on this thread
    // than a dispatch.
    if n_tok * cols < 1 << 14 {
        for (xr, dr) in x.chunks_exact(cols).zip(dst.chunks_exact_mut(arb)) {
            (k.quantize_act)(xr, dr);
        }
        return;
    }
    let out = SharedMut::new(dst);
    let per = n_tok.div_ceil(pool.n_threads() * 4);
    pool.run(n_tok.div_ceil(per), |c| {
        let t0 = c * per;
        let t1 = (t0 + per).min(n_tok);
        // SAFETY: chunk c owns activation rows t0..t1, disjoint from other chunks.
        let d = unsafe { out.slice(t0 * arb, (t1 - t0) * arb) };
        for (xr, dr) in x[t0 * cols..t1 * cols]
            .chunks_exact(cols)
            .zip(d.chunks_exact_mut(arb))
        {
            (k.quantize_act)(xr, dr);
        }
    });
}

/// Interleaves the quantized rows of `buf` into GEMM panels of GEMM_COLS
/// tokens (the last one zero-padded), in parallel when there are many.
fn pack_panels(pool: &ThreadPool, buf: &mut ActBuf, cols: usize, n_tok: usize) {
    let (qb, sb) = panel_sizes(buf.ty, cols);
    let groups = n_tok.div_ceil(GEMM_COLS);
    buf.panels.resize(groups * qb, 0);
    buf.panel_scales.resize(groups * sb, 0.0);
    let arb = buf.rows.len() / n_tok.max(1);
    let (ty, rows) = (buf.ty, &buf.rows);
    let pack = |g: usize, q: &mut [u8], s: &mut [f32]| {
        let t1 = ((g + 1) * GEMM_COLS).min(n_tok);
        let acts: Vec<&[u8]> = rows[g * GEMM_COLS * arb..t1 * arb]
            .chunks_exact(arb)
            .collect();
        pack_panel(ty, &acts, cols, q, s);
    };
    if groups < 2 * pool.n_threads() {
        for ((g, q), s) in buf
            .panels
            .chunks_exact_mut(qb)
            .enumerate()
            .zip(buf.panel_scales.chunks_exact_mut(sb))
        {
            pack(g, q, s);
        }
        return;
    }
    let (pq, ps) = (
        SharedMut::new(&mut buf.panels),
        SharedMut::new(&mut buf.panel_scales),
    );
    pool.run(groups, |g| {
        // SAFETY: task g alone owns panel g of both buffers.
        let (q, s) = unsafe { (pq.slice(g * qb, qb), ps.slice(g * sb, sb)) };
        pack(g, q, s);
    });
}

/// `outs[j][t * rows_j + r] = dot(ws[j].row(r), x[t])` for all matrices in one
/// dispatch. All matrices must have `cols == x.len() / n_tok`.
pub fn matmul_multi(
    pool: &ThreadPool,
    ws: &[QMatrix<'_>],
    x: &[f32],
    n_tok: usize,
    outs: &mut [&mut [f32]],
    scratch: &mut ActScratch,
) {
    assert_eq!(ws.len(), outs.len());
    let cols = ws[0].cols;
    assert!(ws.iter().all(|w| w.cols == cols) && x.len() == cols * n_tok);
    let ks: Vec<&'static QuantKernels> = ws
        .iter()
        .map(|w| kernels(w.ty).expect("QMatrix::new checked the kernel exists"))
        .collect();
    let use_gemm = |k: &QuantKernels| gemm_takes(k, n_tok);
    let mut done: Vec<GgmlType> = Vec::new();
    for k in &ks {
        if !done.contains(&k.act) {
            let buf = scratch.buf(k.act);
            quantize_inputs(pool, k, x, cols, n_tok, &mut buf.rows);
            let needs_panels = |k2: &&QuantKernels| use_gemm(k2) && !gemm_reads_rows(k2.weight);
            if has_panels(k.act) && ks.iter().any(|k2| k2.act == k.act && needs_panels(k2)) {
                pack_panels(pool, buf, cols, n_tok);
            }
            done.push(k.act);
        }
    }
    // The fields apart: the side tables are filled from the rows' table.
    let ActScratch { bufs, sides, owned } = scratch;
    let buf_of = |ty: GgmlType| {
        bufs.iter()
            .find(|b| b.ty == ty)
            .expect("every activation format in use was quantized above")
    };

    let total_rows: usize = ws.iter().map(|w| w.rows).sum();
    // A decode step's products stream their rows once, and every chunk
    // starts a new stream the prefetchers must find again (threads claim
    // chunks in turn, so one thread's chunks are not adjacent). Against
    // eight chunks a thread of up to 256 rows, two of up to 1,024 took
    // 0.86x the time of SmolLM2's one-row step, 0.94x of eight rows, 0.96x
    // of Gemma-3's and of the synthetic 1.7B's one-row steps.
    // One chunk a thread was faster still on a quiet machine but 1.05x
    // slower on eight rows beside a busy process: with nothing left to
    // claim, a preempted thread's share is waited for. A GEMM (prefill)
    // keeps the finer split: its chunks are compute, and SmolLM2's pp512
    // took 1.04x with a coarse one.
    let gemm = ks.iter().any(|k| use_gemm(k));
    let (per_thread, most_rows) = if gemm { (8, 256) } else { (2, MAX_CHUNK_ROWS) };
    let target_chunks = pool.n_threads() * per_thread;
    let chunk_rows = (total_rows / target_chunks).clamp(ROW_TILE, most_rows) / ROW_TILE * ROW_TILE;
    // (matrix, first row, last row) per chunk.
    let mut chunks = Vec::with_capacity(total_rows / chunk_rows + ws.len());
    for (j, w) in ws.iter().enumerate() {
        let mut r = 0;
        while r < w.rows {
            let e = (r + chunk_rows).min(w.rows);
            chunks.push((j, r, e));
            r = e;
        }
    }
    for (o, w) in outs.iter().zip(ws) {
        assert_eq!(o.len(), w.rows * n_tok);
    }

    let act_formats: Vec<GgmlType> = done;
    let act_index = |ty: GgmlType| {
        act_formats
            .iter()
            .position(|&t| t == ty)
            .expect("every activation format in use was quantized above")
    };
    let act_tables: Vec<Vec<&[u8]>> = act_formats
        .iter()
        .map(|&ty| {
            let rows = &buf_of(ty).rows;
            rows.chunks_exact((rows.len() / n_tok.max(1)).max(1))
                .take(n_tok)
                .collect()
        })
        .collect();
    if (1..=PACKED_TOKENS).contains(&n_tok) {
        fill_sides(sides, ws, &ks, |ty| &act_tables[act_index(ty)]);
    }
    let sides = &*sides;
    if (1..=PACKED_TOKENS).contains(&n_tok) {
        let tables: Vec<(GgmlType, &[&[u8]])> = act_formats
            .iter()
            .zip(&act_tables)
            .map(|(&ty, t)| (ty, &t[..n_tok]))
            .collect();
        let product = owned::Product {
            ws,
            ks: &ks,
            chunks: &chunks,
            act_tables: &tables,
            sides,
        };
        if owned.run(pool, &product, outs) {
            return;
        }
    }
    let shared: Vec<SharedMut<f32>> = outs.iter_mut().map(|o| SharedMut::new(o)).collect();
    pool.run(chunks.len(), |c| {
        let (j, r0, r1) = chunks[c];
        let (w, k) = (&ws[j], ks[j]);
        let buf = buf_of(k.act);
        let acts = &buf.rows;
        let arb = acts.len() / n_tok;
        let rows = w.rows;
        let rb = w.row_bytes();
        // The activation table is built once per format, not per chunk.
        let act_rows = &act_tables[act_index(k.act)][..n_tok];
        // The file-layout kernels over the chunk's rows (a GEMM, or the
        // row tiles), wherever the rows are read from.
        let rows_kernels = |w_rows: &[&[u8]]| {
            match k.gemm.filter(|_| use_gemm(k)) {
                Some(gemm) => {
                    let (qb, sb) = panel_sizes(k.act, w.cols);
                    let rows_only = gemm_reads_rows(k.weight);
                    let packed = has_panels(k.act) && !rows_only;
                    // Several panels per call, so each weight row is decoded
                    // once for all of them, but few enough that they stay in
                    // L2 while the rows go by.
                    let per_call = if rows_only {
                        let (lo, hi) = ROWS_PER_CALL_TOKENS;
                        (ROWS_PER_CALL_BYTES / arb.max(1)).clamp(lo, hi) / GEMM_COLS * GEMM_COLS
                    } else {
                        (PANELS_PER_CALL_BYTES / qb.max(1)).max(1) * GEMM_COLS
                    };
                    let nr = r1 - r0;
                    let mut out = vec![0f32; per_call.div_ceil(GEMM_COLS) * nr * GEMM_COLS];
                    for (c, toks) in act_rows.chunks(per_call).enumerate() {
                        let (g0, groups) =
                            (c * per_call / GEMM_COLS, toks.len().div_ceil(GEMM_COLS));
                        let (q, s): (&[u8], &[f32]) = if packed {
                            (
                                &buf.panels[g0 * qb..(g0 + groups) * qb],
                                &buf.panel_scales[g0 * sb..(g0 + groups) * sb],
                            )
                        } else {
                            (&[], &[])
                        };
                        let out = &mut out[..groups * nr * GEMM_COLS];
                        gemm(w.cols, w_rows, toks, q, s, out);
                        for (g, group) in toks.chunks(GEMM_COLS).enumerate() {
                            let tile = &out[g * nr * GEMM_COLS..(g + 1) * nr * GEMM_COLS];
                            let t0 = (g0 + g) * GEMM_COLS;
                            scatter(&shared[j], tile, GEMM_COLS, group.len(), t0, rows, r0, r1);
                        }
                    }
                }
                None => row_tiles(w, k, w_rows, (r0, r1), act_rows, &shared[j]),
            }
        };
        if tiles_take(w, k, n_tok) {
            tile_chunk(w, k, (r0, r1), act_rows, side(sides, w.ty), &shared[j]);
            return;
        }
        // A packed matrix whose file pages left the process: its rows come
        // back from the packed copy (chunks are whole groups of rows).
        if let Some(packed) = w.packed.filter(|_| gemm_reads_packed(w.ty)) {
            if packed_gemm_runs(w.ty) {
                if gemm_takes(k, n_tok) {
                    let nr = r1 - r0;
                    let groups = (r0 / PACKED_GROUP_ROWS, r1 / PACKED_GROUP_ROWS);
                    let mut out = vec![0f32; n_tok.div_ceil(GEMM_COLS) * nr * GEMM_COLS];
                    packed_gemm(w.ty, w.cols, packed, groups, act_rows, &mut out);
                    for (g, group) in act_rows.chunks(GEMM_COLS).enumerate() {
                        let tile = &out[g * nr * GEMM_COLS..(g + 1) * nr * GEMM_COLS];
                        scatter(
                            &shared[j],
                            tile,
                            GEMM_COLS,
                            group.len(),
                            g * GEMM_COLS,
                            rows,
                            r0,
                            r1,
                        );
                    }
                    return;
                }
                // Too few tokens for the GEMM: the file layout's row tiles.
                let w_rows: Vec<&[u8]> = w.data[r0 * rb..r1 * rb].chunks_exact(rb).collect();
                rows_kernels(&w_rows);
                return;
            }
            UNPACKED.with(|cell| {
                let mut buf = cell.borrow_mut();
                buf.resize((r1 - r0) * rb, 0);
                let groups = (r0 / PACKED_GROUP_ROWS, r1 / PACKED_GROUP_ROWS);
                unpack_rows(w.ty, w.cols, packed, groups, &mut buf);
                let rows: Vec<&[u8]> = buf.chunks_exact(rb).collect();
                rows_kernels(&rows);
            });
            return;
        }
        // The rows of the chunk alone (see `tile_chunk`).
        let w_rows: Vec<&[u8]> = w.data[r0 * rb..r1 * rb].chunks_exact(rb).collect();
        rows_kernels(&w_rows);
    });
}

/// Whether `n_tok` tokens of a matrix in the file's layout go through the
/// GEMM microkernel: several do (zero-padding the last group of GEMM_COLS
/// is cheaper than a slower kernel for it), one to a few (a decode step, a
/// small batch, a speculative verification) the tile kernel (see
/// `quant::tile_tokens`).
fn gemm_takes(k: &QuantKernels, n_tok: usize) -> bool {
    k.gemm.is_some() && n_tok > tile_tokens(k.weight)
}

/// Whether `tile_chunk` computes the products of `w` for `n_tok` tokens:
/// every chunk of such a product goes through it, whether the caller's
/// workers or an owned job (`owned`) compute it.
fn tiles_take(w: &QMatrix<'_>, k: &QuantKernels, n_tok: usize) -> bool {
    n_tok <= PACKED_TOKENS && (w.packed.is_some() || !gemm_takes(k, n_tok))
}

/// Rows `r0..r1` of `w` for the tokens `act_rows` through the decode
/// kernels: the packed tile when the matrix has one, else the row tiles.
/// Token t's results go to `out[t * w.rows + r0..]`, and nothing else of
/// `out` is written. Only where `tiles_take` holds.
fn tile_chunk(
    w: &QMatrix<'_>,
    k: &QuantKernels,
    (r0, r1): (usize, usize),
    act_rows: &[&[u8]],
    side: &[BlockSide],
    out: &SharedMut<f32>,
) {
    let n_tok = act_rows.len();
    if let Some(packed) = w.packed.filter(|_| n_tok <= PACKED_TOKENS) {
        // Chunks are whole groups of rows (ROW_TILE is a multiple of
        // them, and a packed matrix has whole groups).
        let groups = (r0 / PACKED_GROUP_ROWS, r1.div_ceil(PACKED_GROUP_ROWS));
        let mut outs: [&mut [f32]; PACKED_TOKENS] = std::array::from_fn(|t| {
            if t < n_tok {
                // SAFETY: the chunk alone owns rows r0..r1 of this output,
                // and each token's rows are a distinct range.
                unsafe { out.slice(t * w.rows + r0, r1 - r0) }
            } else {
                &mut []
            }
        });
        packed_tile(
            k.weight,
            w.cols,
            packed,
            groups,
            act_rows,
            side,
            &mut outs[..n_tok],
        );
        return;
    }
    // A table of the chunk's rows alone: a stack table sized for the
    // largest chunk, zeroed in full per chunk (4 KiB at 256 rows), was a
    // memset in each of a decode step's hundreds of chunks.
    let rb = w.row_bytes();
    let w_rows: Vec<&[u8]> = w.data[r0 * rb..r1 * rb].chunks_exact(rb).collect();
    row_tiles(w, k, &w_rows, (r0, r1), act_rows, out);
}

/// The file-layout row tiles over `w_rows` (rows `r0..r1` of `w`), token
/// t's results into `out[t * w.rows + r0..]`.
fn row_tiles(
    w: &QMatrix<'_>,
    k: &QuantKernels,
    w_rows: &[&[u8]],
    (r0, r1): (usize, usize),
    act_rows: &[&[u8]],
    out: &SharedMut<f32>,
) {
    let n_tok = act_rows.len();
    if n_tok == 1 {
        // SAFETY: the chunk alone owns rows r0..r1 of this output.
        let o = unsafe { out.slice(r0, r1 - r0) };
        (k.vec_dot_tile)(w.cols, w_rows, act_rows, o);
        return;
    }
    TILE_OUT.with(|cell| {
        // Reused per thread: a batched decode step runs about a thousand
        // of these.
        let mut tile = cell.borrow_mut();
        tile.resize((r1 - r0) * n_tok, 0.0);
        (k.vec_dot_tile)(w.cols, w_rows, act_rows, &mut tile);
        scatter(out, &tile, n_tok, n_tok, 0, w.rows, r0, r1);
    })
}

/// Writes the first `nt` columns of a `(r1 - r0) x stride` row-major tile
/// into tokens `t0..t0 + nt` of an output laid out `[token][row]`.
#[allow(clippy::too_many_arguments)]
fn scatter(
    out: &SharedMut<f32>,
    tile: &[f32],
    stride: usize,
    nt: usize,
    t0: usize,
    rows: usize,
    r0: usize,
    r1: usize,
) {
    for ti in 0..nt {
        // SAFETY: the caller's chunk alone owns rows r0..r1 of this output,
        // and each token's segment is a distinct range of it.
        let o = unsafe { out.slice((t0 + ti) * rows + r0, r1 - r0) };
        for (ri, v) in o.iter_mut().enumerate() {
            *v = tile[ri * stride + ti];
        }
    }
}

/// Single-matrix convenience wrapper.
pub fn matmul(
    pool: &ThreadPool,
    w: QMatrix<'_>,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
    scratch: &mut ActScratch,
) {
    matmul_multi(pool, &[w], x, n_tok, &mut [out], scratch);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic bytes with every f16 field finite (see
    /// `benches/kernels.rs`).
    fn weight_bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8 & 0x3b
            })
            .collect()
    }

    #[test]
    fn prefill_rows_equal_single_token_rows_bit_for_bit() {
        // Through the GEMM (more than `tile_tokens`, a padded last group,
        // 300 tokens: more panels than one call takes) and through the
        // tiles, every token gets the bits it gets alone.
        let pool = ThreadPool::new(2);
        let (rows, cols) = (37, 512);
        for ty in [
            GgmlType::Q4K,
            GgmlType::Q6K,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::IQ4NL,
            GgmlType::MXFP4,
            GgmlType::IQ4XS,
            GgmlType::IQ3S,
            GgmlType::IQ3XXS,
            GgmlType::IQ2S,
            GgmlType::IQ2XS,
            GgmlType::IQ2XXS,
            GgmlType::IQ1S,
            GgmlType::IQ1M,
            GgmlType::TQ1_0,
            GgmlType::TQ2_0,
        ] {
            let data = weight_bytes(rows * ty.row_bytes(cols).unwrap(), 0x9e37_79b9_7f4a_7c15);
            let w = QMatrix::new(ty, rows, cols, &data).unwrap();
            for n_tok in [2, 4, 11, 300] {
                let x: Vec<f32> = (0..n_tok * cols)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
                    .collect();
                let mut scratch = ActScratch::default();
                let mut all = vec![f32::NAN; rows * n_tok];
                matmul(&pool, w, &x, n_tok, &mut all, &mut scratch);
                for t in 0..n_tok {
                    let mut one = vec![f32::NAN; rows];
                    let xt = &x[t * cols..(t + 1) * cols];
                    matmul(&pool, w, xt, 1, &mut one, &mut scratch);
                    for r in 0..rows {
                        assert_eq!(
                            all[t * rows + r].to_bits(),
                            one[r].to_bits(),
                            "{} n_tok={n_tok} token {t} row {r}",
                            ty.name()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn packed_matrices_give_the_bits_of_the_file_layout() {
        // A repacked matrix (where this CPU repacks) gives every token the
        // bits the file's layout gives, through the packed kernel (up to
        // PACKED_TOKENS tokens) and the GEMM beyond.
        let pool = ThreadPool::new(2);
        let (rows, cols) = (96, 512);
        for ty in [
            GgmlType::Q4K,
            GgmlType::Q6K,
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::IQ4NL,
            GgmlType::MXFP4,
            GgmlType::IQ4XS,
            GgmlType::TQ2_0,
            GgmlType::IQ3S,
            GgmlType::IQ3XXS,
            GgmlType::IQ2S,
            GgmlType::IQ2XS,
            GgmlType::IQ2XXS,
        ] {
            let data = weight_bytes(rows * ty.row_bytes(cols).unwrap(), 0x51_7cc1_b727_220a);
            let Some(packed) = crate::quant::pack_matrix(ty, rows, cols, &data) else {
                eprintln!("{} is not repacked on this CPU", ty.name());
                continue;
            };
            let plain = QMatrix::new(ty, rows, cols, &data).unwrap();
            let fast = QMatrix {
                packed: Some(&packed),
                ..plain
            };
            // 9 and beyond go through the GEMM, which reads a packed Q6_K
            // matrix from its packed form and builds the grid i-quants'
            // slots from theirs (300: more tokens than one call's tile).
            for n_tok in [1, 2, 3, 5, 8, 9, 40, 300] {
                let x: Vec<f32> = (0..n_tok * cols)
                    .map(|i| ((i * 53 % 97) as f32 - 48.0) / 20.0)
                    .collect();
                let mut scratch = ActScratch::default();
                let (mut a, mut b) = (vec![f32::NAN; rows * n_tok], vec![f32::NAN; rows * n_tok]);
                matmul(&pool, plain, &x, n_tok, &mut a, &mut scratch);
                matmul(&pool, fast, &x, n_tok, &mut b, &mut scratch);
                for (i, (p, q)) in a.iter().zip(&b).enumerate() {
                    assert_eq!(
                        p.to_bits(),
                        q.to_bits(),
                        "{} n_tok={n_tok} at {i}",
                        ty.name()
                    );
                }
            }
        }
    }
}
