//! A decode step's products as owned jobs (`threadpool::OwnedJob`): the
//! job keeps the model file alive (every matrix it reads lies in memory
//! the file owns, checked per product), owns a copy of the quantized
//! activations and their side tables, and has an output buffer of its own
//! for the chunks workers compute, which the caller copies into its
//! output as each is done (`ChunkWork::collect`). So a worker preempted
//! mid-chunk never holds up the step: the caller redoes the chunk and
//! moves on.

use std::sync::Arc;

use super::{side, tile_chunk, QMatrix, Sides};
use crate::gguf::GgufFile;
use crate::quant::{GgmlType, QuantKernels, PACKED_TOKENS};
use crate::threadpool::{ChunkWork, OwnedJob, SharedMut, Slot, ThreadPool};

#[derive(Default)]
pub(super) struct DecodeProducts {
    /// Owns the bytes of every matrix in `ws`.
    file: Option<Arc<GgufFile>>,
    /// Views into `file`'s memory, their lifetime erased (see `prepare`).
    ws: Vec<QMatrix<'static>>,
    ks: Vec<&'static QuantKernels>,
    /// (matrix, first row, end row) per chunk.
    chunks: Vec<(usize, usize, usize)>,
    n_tok: usize,
    /// Each activation format's quantized rows: (format, bytes a row,
    /// the rows), and which of them each matrix reads.
    acts: Vec<(GgmlType, usize, Vec<u8>)>,
    act_of: Vec<usize>,
    sides: Sides,
    /// The workers' results, laid out as the caller's outputs, and
    /// pointers to them (taken while the job is exclusively ours).
    job_out: Vec<Vec<f32>>,
    job_ptrs: Vec<SharedMut<f32>>,
    /// The caller's outputs for the current dispatch (`Slot::Out`).
    out_ptrs: Vec<SharedMut<f32>>,
}

/// One product as `matmul_multi` laid it out: the matrices and their
/// kernels, the chunks (matrix, first row, end row), each activation
/// format's quantized rows (one per token) and the side tables.
pub(super) struct Product<'p, 'w> {
    pub ws: &'p [QMatrix<'w>],
    pub ks: &'p [&'static QuantKernels],
    pub chunks: &'p [(usize, usize, usize)],
    pub act_tables: &'p [(GgmlType, &'p [&'p [u8]])],
    pub sides: &'p Sides,
}

/// The owned job a scratch reuses from one product to the next.
#[derive(Default)]
pub(super) struct OwnedProducts {
    file: Option<Arc<GgufFile>>,
    job: Option<Arc<OwnedJob<DecodeProducts>>>,
}

impl OwnedProducts {
    /// Products read matrices of `file` from now on.
    pub(super) fn set_file(&mut self, file: &Arc<GgufFile>) {
        if !self.file.as_ref().is_some_and(|f| Arc::ptr_eq(f, file)) {
            self.file = Some(Arc::clone(file));
        }
    }

    /// Runs product `p` into `outs` as an owned job, or returns false
    /// (nothing done) where one does not apply: no file set, a matrix
    /// outside it, a product the decode tiles do not take, or a single
    /// chunk.
    pub(super) fn run(
        &mut self,
        pool: &ThreadPool,
        p: &Product<'_, '_>,
        outs: &mut [&mut [f32]],
    ) -> bool {
        let Some(file) = &self.file else {
            return false;
        };
        let (ws, ks) = (p.ws, p.ks);
        let n_tok = p.act_tables.first().map_or(0, |(_, t)| t.len());
        let held = |b: &[u8]| b.is_empty() || file.holds(b);
        if pool.n_threads() < 2
            || p.chunks.len() < 2
            || n_tok == 0
            || !ws.iter().zip(ks).all(|(w, k)| {
                super::tiles_take(w, k, n_tok) && held(w.data) && w.packed.is_none_or(held)
            })
        {
            return false;
        }
        // A job a late worker still holds is left to it; the next one is new.
        if self.job.as_mut().is_none_or(|j| Arc::get_mut(j).is_none()) {
            self.job = Some(Arc::new(OwnedJob::new(DecodeProducts::default())));
        }
        let job = self.job.as_mut().expect("set above");
        {
            let owned = Arc::get_mut(job).expect("no other holder of a fresh or idle job");
            owned.reset(p.chunks.len());
            owned.work.prepare(file, p, outs);
        }
        pool.run_owned(job);
        true
    }
}

impl DecodeProducts {
    fn prepare(&mut self, file: &Arc<GgufFile>, p: &Product<'_, '_>, outs: &mut [&mut [f32]]) {
        let Product {
            ws,
            ks,
            chunks,
            act_tables,
            sides,
        } = *p;
        self.file = Some(Arc::clone(file));
        self.ws.clear();
        // SAFETY: every matrix's bytes lie in memory `file` owns (checked
        // by the caller with `GgufFile::holds`), and this job holds the
        // file's `Arc` for as long as anyone can read `ws`: the caller
        // during its dispatch, a late worker through the job's `Arc`.
        self.ws.extend(
            ws.iter()
                .map(|w| unsafe { std::mem::transmute::<QMatrix<'_>, QMatrix<'static>>(*w) }),
        );
        self.ks.clear();
        self.ks.extend_from_slice(ks);
        self.chunks.clear();
        self.chunks.extend_from_slice(chunks);
        self.n_tok = act_tables[0].1.len();
        self.acts
            .resize_with(act_tables.len(), || (GgmlType::F32, 0, Vec::new()));
        for ((ty, arb, bytes), (t, rows)) in self.acts.iter_mut().zip(act_tables) {
            *ty = *t;
            *arb = rows[0].len();
            bytes.clear();
            rows.iter().for_each(|r| bytes.extend_from_slice(r));
        }
        self.act_of.clear();
        self.act_of.extend(ks.iter().map(|k| {
            self.acts
                .iter()
                .position(|(t, _, _)| *t == k.act)
                .expect("every matrix's activation format was quantized")
        }));
        self.sides
            .resize_with(sides.len(), || (GgmlType::F32, Vec::new()));
        for ((ty, v), (t, src)) in self.sides.iter_mut().zip(sides) {
            *ty = *t;
            v.clone_from(src);
        }
        // Grow only: one job serves every product of a step (three outputs,
        // then one of another size, then the head's), and fitting the
        // buffers to each product freed and zero-filled them again each
        // time, about 4.4 MB of memset a step of eight SmolLM2 rows. A
        // chunk's rows are written before `collect` reads them, so stale
        // values beyond or under them are never seen.
        if self.job_out.len() < outs.len() {
            self.job_out.resize_with(outs.len(), Vec::new);
        }
        for (buf, o) in self.job_out.iter_mut().zip(outs.iter()) {
            if buf.len() < o.len() {
                buf.resize(o.len(), 0.0);
            }
        }
        self.job_ptrs.clear();
        self.job_ptrs
            .extend(self.job_out.iter_mut().map(|b| SharedMut::new(b)));
        self.out_ptrs.clear();
        self.out_ptrs
            .extend(outs.iter_mut().map(|o| SharedMut::new(o)));
    }
}

impl ChunkWork for DecodeProducts {
    fn compute(&self, i: usize, slot: Slot) {
        let (j, r0, r1) = self.chunks[i];
        let (w, k) = (&self.ws[j], self.ks[j]);
        let (_, arb, bytes) = &self.acts[self.act_of[j]];
        let mut rows: [&[u8]; PACKED_TOKENS] = [&[]; PACKED_TOKENS];
        for (r, b) in rows.iter_mut().zip(bytes.chunks_exact(*arb)) {
            *r = b;
        }
        let out = match slot {
            Slot::Job => &self.job_ptrs[j],
            Slot::Out => &self.out_ptrs[j],
        };
        tile_chunk(
            w,
            k,
            (r0, r1),
            &rows[..self.n_tok],
            side(&self.sides, w.ty),
            out,
        );
    }

    fn collect(&self, i: usize) {
        let (j, r0, r1) = self.chunks[i];
        let rows = self.ws[j].rows;
        for t in 0..self.n_tok {
            let at = t * rows + r0;
            // SAFETY: the worker that computed chunk i has published these
            // rows and writes no more; a late worker may still write other
            // chunks' rows of this buffer, never these. The output is the
            // caller's for the dispatch, and only this thread writes it
            // there, one chunk's rows at a time.
            let (src, dst) = unsafe {
                (
                    self.job_ptrs[j].slice(at, r1 - r0),
                    self.out_ptrs[j].slice(at, r1 - r0),
                )
            };
            dst.copy_from_slice(src);
        }
    }
}
