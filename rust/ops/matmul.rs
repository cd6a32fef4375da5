//! Quantized matrix products over the worker pool.
//!
//! Activations are quantized once per product into the weight format's
//! integer partner, then every thread claims blocks of weight rows and
//! computes those rows for all tokens, so each weight byte is read from
//! memory once per call whatever the token count (prefill is a GEMM, not
//! one matrix-vector product per token). Several matrices that read the
//! same input (q/k/v, gate/up) go in a single dispatch.

use crate::quant::{kernels, pack_act_scales, GgmlType, QuantKernels, GEMM_COLS};
use crate::threadpool::{SharedMut, ThreadPool};
use crate::{Error, Result};

/// A row-major weight matrix inside the mapped model file.
#[derive(Clone, Copy)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
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

/// Reusable buffers for quantized activations, one per activation format.
#[derive(Default)]
pub struct ActScratch {
    bufs: Vec<(GgmlType, Vec<u8>)>,
}

impl ActScratch {
    fn buf(&mut self, ty: GgmlType) -> &mut Vec<u8> {
        let i = match self.bufs.iter().position(|(t, _)| *t == ty) {
            Some(i) => i,
            None => {
                self.bufs.push((ty, Vec::new()));
                self.bufs.len() - 1
            }
        };
        &mut self.bufs[i].1
    }

    fn get(&self, ty: GgmlType) -> &[u8] {
        self.bufs
            .iter()
            .find(|(t, _)| *t == ty)
            .map_or(&[][..], |(_, b)| b.as_slice())
    }
}

/// Tokens handled together against one block of weight rows: their
/// quantized activations stay in L1 while the rows stream past.
const TOKEN_TILE: usize = 4;
const ROW_TILE: usize = 4;

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
    if n_tok < 8 {
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
    let mut done: Vec<GgmlType> = Vec::new();
    for k in &ks {
        if !done.contains(&k.act) {
            quantize_inputs(pool, k, x, cols, n_tok, scratch.buf(k.act));
            done.push(k.act);
        }
    }
    let scratch = &*scratch;

    let total_rows: usize = ws.iter().map(|w| w.rows).sum();
    let target_chunks = pool.n_threads() * 8;
    let chunk_rows = (total_rows / target_chunks).clamp(ROW_TILE, 256) / ROW_TILE * ROW_TILE;
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
    let shared: Vec<SharedMut<f32>> = outs.iter_mut().map(|o| SharedMut::new(o)).collect();

    pool.run(chunks.len(), |c| {
        let (j, r0, r1) = chunks[c];
        let (w, k) = (&ws[j], ks[j]);
        let acts = scratch.get(k.act);
        let arb = acts.len() / n_tok;
        let rows = w.rows;
        let mut t0 = 0;
        let rb = w.row_bytes();
        let w_rows: Vec<&[u8]> = w.data[r0 * rb..r1 * rb].chunks_exact(rb).collect();
        // Whole groups of GEMM_COLS tokens go through the format's GEMM
        // microkernel; what is left (all of decode) through the tile kernel.
        if let Some(gemm) = k.gemm.filter(|_| n_tok >= GEMM_COLS) {
            let nb = w.cols / k.weight.block_size();
            let mut scales = vec![0f32; nb * 16];
            let mut buf = vec![0f32; (r1 - r0) * GEMM_COLS];
            while t0 + GEMM_COLS <= n_tok {
                let act_rows: [&[u8]; GEMM_COLS] =
                    std::array::from_fn(|i| &acts[(t0 + i) * arb..(t0 + i + 1) * arb]);
                pack_act_scales(k.act, &act_rows, nb, &mut scales);
                gemm(w.cols, &w_rows, &act_rows, &scales, &mut buf);
                scatter(&shared[j], &buf, GEMM_COLS, t0, rows, r0, r1);
                t0 += GEMM_COLS;
            }
        }
        // The rest in tiles of up to TOKEN_TILE tokens; the tile kernel walks
        // all of this chunk's rows in one call.
        let mut buf = Vec::new();
        while t0 < n_tok {
            let nt = (n_tok - t0).min(TOKEN_TILE);
            let act_rows: Vec<&[u8]> = (t0..t0 + nt)
                .map(|t| &acts[t * arb..(t + 1) * arb])
                .collect();
            if nt == 1 {
                // SAFETY: chunk c alone owns rows r0..r1 of matrix j, and each
                // token's segment is a distinct range of the output.
                let o = unsafe { shared[j].slice(t0 * rows + r0, r1 - r0) };
                (k.vec_dot_tile)(w.cols, &w_rows, &act_rows, o);
            } else {
                buf.resize((r1 - r0) * nt, 0.0);
                (k.vec_dot_tile)(w.cols, &w_rows, &act_rows, &mut buf);
                scatter(&shared[j], &buf, nt, t0, rows, r0, r1);
            }
            t0 += nt;
        }
    });
}

/// Writes a `(r1 - r0) x nt` row-major tile into tokens `t0..t0 + nt` of an
/// output laid out `[token][row]`.
fn scatter(
    out: &SharedMut<f32>,
    tile: &[f32],
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
            *v = tile[ri * nt + ti];
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
