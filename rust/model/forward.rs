//! The forward pass every architecture shares: the row layout of a batch
//! of segments, the token embedding, the rotary angles, the per-layer
//! dispatch to the architecture's own layer, and the output head with its
//! picked rows. Batched rows equal one-token decoding because this is the
//! only place that lays rows out.

use std::sync::{Arc, RwLock};

use super::arch;
use super::blocks::Norm;
use super::config::{Meta, ModelConfig};
use super::family::{Arch, EncoderInput};
use super::kv_cache::KvCache;
use super::pager::{LayerPager, OffloadSpec, PagerPass, PagerStats};
use super::pass::{fit, Pass, Scratch, Segment};
use super::weights::{matrix, opt_vector, vector, MatRef};
use crate::gguf::{GgufFile, Held, Paging, SharedPlace, TensorInfo, WeightArena};
use crate::lora::targets::BaseModel;
use crate::lora::{self, ActiveLora};
use crate::ops::matmul::{matmul, ActScratch, QMatrix};
use crate::ops::rope::{Rope, RopeScaling};
use crate::ops::vec::VecKernels;
use crate::quant::dequantize_row;
use crate::threadpool::ThreadPool;
use crate::{Error, Result};

/// Rotary tables: global layers, local (sliding-window) layers, and the
/// long-context factors a session switches to past `long_from` tokens.
pub struct Ropes {
    pub global: Rope,
    pub local: Rope,
    pub long: Option<(Rope, usize)>,
}

impl Ropes {
    fn for_context(&self, n_ctx: usize) -> &Rope {
        match &self.long {
            Some((r, from)) if n_ctx > *from => r,
            _ => &self.global,
        }
    }
}

/// Per-pair rotary frequency factors: `rope_freqs` (Llama 3.1 style, one
/// set), or LongRoPE's `rope_factors_short` / `_long`, the long ones for a
/// session whose context exceeds `original_ctx` (as llama.cpp chooses).
struct RopeFactors {
    short: Vec<f32>,
    long: Vec<f32>,
    original_ctx: usize,
}

impl RopeFactors {
    fn read(f: &GgufFile, cfg: &ModelConfig) -> Result<Option<Self>> {
        let half = cfg.rope_dims / 2;
        if f.tensor("rope_freqs.weight").is_some() {
            let v = vector(f, "rope_freqs.weight", half)?;
            return Ok(Some(RopeFactors {
                short: v.clone(),
                long: v,
                original_ctx: usize::MAX,
            }));
        }
        let short = opt_vector(f, "rope_factors_short.weight", half)?;
        let long = opt_vector(f, "rope_factors_long.weight", half)?;
        match (short, long) {
            (None, None) => Ok(None),
            (Some(short), Some(long)) => {
                let m = Meta { f, arch: &cfg.arch };
                let original_ctx = m
                    .opt_u("rope.scaling.original_context_length")?
                    .unwrap_or(cfg.n_ctx_train);
                Ok(Some(RopeFactors {
                    short,
                    long,
                    original_ctx,
                }))
            }
            _ => Err(Error::load(
                "rope_factors_short and rope_factors_long must come together",
            )),
        }
    }
}

pub struct Model {
    pub file: Arc<GgufFile>,
    pub cfg: ModelConfig,
    tok_embd: MatRef,
    output: MatRef,
    /// Absent only in an encoder (BERT), whose last layer ends in a norm.
    output_norm: Option<Norm>,
    output_bias: Option<Vec<f32>>,
    arch: Box<dyn Arch>,
    encoder: Option<EncoderInput>,
    ropes: Ropes,
    /// The memory budget's pager, when the model runs under one.
    pager: RwLock<Option<Arc<LayerPager>>>,
    /// Set once `prepare_weights` has started the arena's build.
    preparing: std::sync::atomic::AtomicBool,
}

impl Model {
    pub fn load(file: Arc<GgufFile>) -> Result<Self> {
        let f = &*file;
        let name = f
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .ok_or_else(|| Error::load("metadata general.architecture is missing"))?
            .to_string();
        let entry = arch::find(&name)?;
        let mut cfg = ModelConfig::from_gguf(f, &name, entry.recurrent)?;
        let e = cfg.n_embd;
        let tok_embd = matrix(f, "token_embd.weight", e, None)?;
        cfg.n_vocab = tok_embd.rows;
        let loaded = (entry.load)(f, &mut cfg)?;
        if let Some(il) = (0..cfg.n_layer).find(|&il| cfg.is_recr_layer(il)) {
            if cfg.ssm.is_none() {
                return Err(Error::load(format!(
                    "metadata {name}.attention.head_count_kv is 0 for layer {il}: \
                     {name} has no layers without attention"
                )));
            }
        }
        let output = if f.tensor("output.weight").is_some() && !loaded.tied_output {
            matrix(f, "output.weight", e, Some(cfg.n_vocab))?
        } else {
            tok_embd
        };
        let on = loaded.output_norm;
        let output_norm = if cfg.causal || f.tensor(&format!("{on}.weight")).is_some() {
            Some(Norm::from_vectors(
                cfg.norm,
                vector(f, &format!("{on}.weight"), e)?,
                opt_vector(f, &format!("{on}.bias"), e)?,
                cfg.norm_eps,
            ))
        } else {
            None
        };
        let output_bias = opt_vector(f, "output.bias", cfg.n_vocab)?;
        let base = Rope::new(
            cfg.rope_order,
            cfg.rope_dims,
            cfg.rope_base,
            &cfg.rope_scaling,
        );
        let af = match cfg.rope_scaling {
            RopeScaling::Yarn { .. } => 1.0,
            _ => cfg.rope_attn_factor,
        };
        let local = Rope::new(
            cfg.rope_order,
            cfg.rope_dims,
            cfg.rope_base_local,
            &cfg.rope_scaling_local,
        )
        .with_factors(Vec::new(), af);
        let (global, long) = match RopeFactors::read(f, &cfg)? {
            Some(rf) => (
                base.clone().with_factors(rf.short, af),
                Some((base.with_factors(rf.long, af), rf.original_ctx)),
            ),
            None => (base.with_factors(Vec::new(), af), None),
        };
        Ok(Model {
            file,
            cfg,
            tok_embd,
            output,
            output_norm,
            output_bias,
            arch: loaded.arch,
            encoder: loaded.encoder,
            ropes: Ropes {
                global,
                local,
                long,
            },
            pager: RwLock::new(None),
            preparing: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Runs the model under a memory budget from now on (`None`: plainly
    /// mapped again). Passes already running finish under the old pager.
    pub fn set_offload(&self, spec: Option<OffloadSpec>) -> Result<()> {
        let pager = match spec {
            Some(spec) => Some(Arc::new(LayerPager::new(
                Arc::clone(&self.file),
                self.cfg.n_layer,
                &self.output,
                spec,
            )?)),
            None => None,
        };
        let plain = pager.is_none();
        // Under a budget every weight is read through the pager's mapping.
        self.file.set_packed_on(plain);
        *self.pager.write().unwrap_or_else(|e| e.into_inner()) = pager;
        if plain && self.file.is_mapped() {
            // The pager turned fault read-around off; a plain mapping wants
            // it back. Advice only: a failure costs speed, never bytes.
            let _ = self.file.page(0, self.file.file_size(), Paging::Normal);
        }
        Ok(())
    }

    /// Starts building the weight arena (the repacked decode layouts and
    /// huge-page copies the first pass would otherwise build) on a thread
    /// of its own, with `threads` workers, unless the model runs under an
    /// offload budget (which never holds them). Returns at once; a pass
    /// that starts before the build ends waits for it, as it would have
    /// built it. Why: the build is a load-time cost (0.3 s of Gemma-3's
    /// first request in a fresh process, most of it faulting in new
    /// memory), and an engine usually has other work before its first
    /// pass (a server waits for requests, a request is tokenized and its
    /// stored blocks read), which it now overlaps. llama.cpp repacks while
    /// loading too. Once per model.
    pub fn prepare_weights(self: &Arc<Self>, threads: usize) {
        use std::sync::atomic::Ordering;
        if self.current_pager().is_some() || self.preparing.swap(true, Ordering::AcqRel) {
            return;
        }
        let m = Arc::clone(self);
        // A failed spawn only leaves the build to the first pass.
        let _ = std::thread::Builder::new()
            .name("oxillama-weights".into())
            .spawn(move || m.wait_weights(threads));
    }

    /// Returns once the weight arena is built (building it on this thread
    /// if nobody has started), unless the model runs under an offload
    /// budget: what a caller that wants the first pass to find the weights
    /// ready (a server before it reports itself ready) waits on.
    pub fn wait_weights(&self, threads: usize) {
        if self.current_pager().is_none() {
            let pool = crate::threadpool::shared_pool(threads.max(1));
            self.file.ensure_packed(|f| pack_weights(&pool, f));
        }
    }

    pub fn offload(&self) -> Option<(OffloadSpec, PagerStats)> {
        self.current_pager().map(|p| (p.spec().clone(), p.stats()))
    }

    fn current_pager(&self) -> Option<Arc<LayerPager>> {
        self.pager.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `rows` hidden states through the output head into `logits` (`rows
    /// x n_vocab`). Under a pager the head goes slice by slice of its rows;
    /// each row's dot product is the same computation either way.
    fn head_matmul(
        &self,
        pool: &ThreadPool,
        h: &[f32],
        rows: usize,
        logits: &mut [f32],
        acts: &mut ActScratch,
        pass: Option<&mut PagerPass<'_>>,
    ) -> Result<()> {
        let w = self.output.view(&self.file);
        acts.set_file(&self.file);
        let Some(pass) = pass else {
            matmul(pool, w, h, rows, logits, acts);
            return Ok(());
        };
        let (per, n_slices) = pass.head_slices();
        let n_vocab = w.rows;
        let rb = w.data.len() / n_vocab.max(1);
        let mut tmp = Vec::new();
        for c in 0..n_slices {
            pass.enter_head(c)?;
            let (r0, r1) = (c * per, ((c + 1) * per).min(n_vocab));
            let slice = QMatrix {
                ty: w.ty,
                rows: r1 - r0,
                cols: w.cols,
                data: &w.data[r0 * rb..r1 * rb],
                packed: None,
            };
            let out = fit(&mut tmp, rows * (r1 - r0));
            matmul(pool, slice, h, rows, out, acts);
            for t in 0..rows {
                logits[t * n_vocab + r0..t * n_vocab + r1]
                    .copy_from_slice(&out[t * (r1 - r0)..(t + 1) * (r1 - r0)]);
            }
        }
        Ok(())
    }

    /// The output head alone: logits of one normalized hidden state, with
    /// the same kernels (hence bits) as the end of `forward`.
    pub fn head(
        &self,
        pool: &ThreadPool,
        hidden: &[f32],
        loras: &[ActiveLora],
        s: &mut Scratch,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        if hidden.len() != self.cfg.n_embd {
            return Err(Error::invalid(format!(
                "hidden state has {} values, the model's embedding has {}",
                hidden.len(),
                self.cfg.n_embd
            )));
        }
        logits.resize(self.cfg.n_vocab, 0.0);
        let pager = self.current_pager();
        let mut pass = pager.as_deref().map(LayerPager::begin);
        self.head_matmul(pool, hidden, 1, logits, &mut s.acts, pass.as_mut())?;
        if !loras.is_empty() {
            let vk = crate::ops::vec::best();
            let one = std::iter::once((loras, 0, 1));
            lora::apply_ranges(pool, vk, &self.output, hidden, logits, one);
        }
        self.finish_logits(logits);
        Ok(())
    }

    /// Output bias, Command-R's and Granite's logit scale, Gemma 2's final
    /// softcap, in llama.cpp's order.
    fn finish_logits(&self, logits: &mut [f32]) {
        if let Some(b) = &self.output_bias {
            for row in logits.chunks_exact_mut(b.len()) {
                row.iter_mut().zip(b).for_each(|(x, y)| *x += y);
            }
        }
        if !self.cfg.has_logit_transform() {
            return;
        }
        let mul = self.cfg.logit_mul;
        if mul != 1.0 {
            logits.iter_mut().for_each(|x| *x *= mul);
        }
        if let Some(cap) = self.cfg.final_softcap {
            let inv = 1.0 / cap;
            logits.iter_mut().for_each(|x| *x = (*x * inv).tanh() * cap);
        }
    }

    pub fn n_vocab(&self) -> usize {
        self.cfg.n_vocab
    }

    /// What a LoRA adapter is checked against (the token embedding and the
    /// output head share one offset when the head is tied).
    pub fn lora_base(&self) -> BaseModel<'_> {
        BaseModel {
            file: &self.file,
            cfg: &self.cfg,
            tok_embd_offset: self.tok_embd.offset,
            output_offset: self.output.offset,
        }
    }

    /// One forward pass over several sequences at once, each with its own
    /// KV cache and position: the weight matrices are read once for all
    /// their tokens (a GEMM over the batch), attention runs per sequence.
    /// Writes the last token's logits of each segment, or every token's for
    /// a segment with `all_rows` (and for a single segment with
    /// `all_logits`), segment after segment (`rows x n_vocab`).
    pub fn forward_segments(
        &self,
        pool: &ThreadPool,
        vk: &VecKernels,
        segs: &mut [Segment<'_>],
        all_logits: bool,
        s: &mut Scratch,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        if !self.cfg.causal {
            return Err(Error::generate(format!(
                "{} is an encoder (embedding) model with bidirectional attention: \
                 it cannot generate; use embed()",
                self.cfg.arch
            )));
        }
        let all_logits = all_logits && segs.len() == 1;
        self.run_layers(pool, vk, segs, s, |p, s, pass| {
            let c = &self.cfg;
            // Only the rows whose logits are wanted go through the output
            // head, which is the largest matrix of a small model.
            let mut picked: Vec<usize> = Vec::with_capacity(p.segs.len());
            // Head rows of each segment: [picked_starts[g], picked_starts[g + 1]).
            let mut picked_starts = Vec::with_capacity(p.segs.len() + 1);
            for (g, seg) in p.segs.iter().enumerate() {
                picked_starts.push(picked.len());
                let (a, b) = (p.starts[g], p.starts[g + 1]);
                if all_logits || seg.all_rows {
                    picked.extend(a..b);
                } else {
                    picked.push(b - 1);
                }
            }
            picked_starts.push(picked.len());
            let (e, rows) = (c.n_embd, picked.len());
            fit(&mut s.h, rows * e);
            for (r, &t) in picked.iter().enumerate() {
                self.final_norm(pool, &s.x[t * e..(t + 1) * e], &mut s.h[r * e..(r + 1) * e]);
            }
            logits.resize(rows * c.n_vocab, 0.0);
            self.head_matmul(pool, &s.h, rows, logits, &mut s.acts, pass)?;
            if p.segs.iter().any(|g| !g.lora.is_empty()) {
                let ranges: Vec<(&[ActiveLora], usize, usize)> = p
                    .segs
                    .iter()
                    .enumerate()
                    .map(|(g, seg)| (seg.lora, picked_starts[g], picked_starts[g + 1]))
                    .collect();
                lora::apply_ranges(pool, vk, &self.output, &s.h, logits, ranges.into_iter());
            }
            self.finish_logits(logits);
            Ok(())
        })
    }

    /// The final hidden state of every row of every segment (`rows x
    /// n_embd`, segment after segment), after the output norm when the
    /// model has one: what llama.cpp pools into embeddings.
    pub fn forward_hidden(
        &self,
        pool: &ThreadPool,
        vk: &VecKernels,
        segs: &mut [Segment<'_>],
        s: &mut Scratch,
        out: &mut [f32],
    ) -> Result<()> {
        self.run_layers(pool, vk, segs, s, |p, s, _| {
            let e = self.cfg.n_embd;
            if out.len() != p.n * e {
                return Err(Error::internal("hidden-state buffer of the wrong size"));
            }
            self.final_norm(p.pool, &s.x[..p.n * e], out);
            Ok(())
        })
    }

    /// The output norm of rows `x` into `out` (a copy without one); rows
    /// spread over `pool` when there are many.
    fn final_norm(&self, pool: &ThreadPool, x: &[f32], out: &mut [f32]) {
        match &self.output_norm {
            Some(n) => n.apply(pool, x, out),
            None => out.copy_from_slice(x),
        }
    }

    /// Lays the segments' rows out, embeds them, runs every layer, then
    /// hands the pass (with the residual stream in `s.x`) to `finish`.
    fn run_layers<R>(
        &self,
        pool: &ThreadPool,
        vk: &VecKernels,
        segs: &mut [Segment<'_>],
        s: &mut Scratch,
        finish: impl FnOnce(&Pass<'_, '_, '_>, &mut Scratch, Option<&mut PagerPass<'_>>) -> Result<R>,
    ) -> Result<R> {
        if segs.iter().any(|g| g.tokens.is_empty()) || segs.is_empty() {
            return Err(Error::generate("forward called with no tokens"));
        }
        if segs
            .iter()
            .any(|g| g.rec.is_some() != self.cfg.ssm.is_some())
        {
            return Err(Error::internal(
                "a segment's recurrent state does not match the model",
            ));
        }
        // Row layout: the segments' tokens one after the other.
        let mut starts = Vec::with_capacity(segs.len() + 1);
        let mut rows_pos = Vec::new();
        let mut tokens = Vec::new();
        for g in segs.iter() {
            starts.push(tokens.len());
            tokens.extend_from_slice(g.tokens);
            rows_pos.extend((0..g.tokens.len()).map(|t| g.pos0 + t));
        }
        starts.push(tokens.len());
        let c = &self.cfg;
        let n = tokens.len();
        let pager = self.current_pager();
        if pager.is_none() {
            self.file.ensure_packed(|f| pack_weights(pool, f));
        }
        let mut pass = pager.as_deref().map(LayerPager::begin);
        s.acts.set_file(&self.file);
        self.embed(&tokens, (vk, segs, &starts), s, pass.as_mut())?;
        if let Some(enc) = &self.encoder {
            enc.apply(&self.file, &rows_pos, &mut s.x)?;
        }
        self.angles(segs, &starts, &rows_pos, s);
        let mut p = Pass {
            pool,
            vk,
            file: &self.file,
            cfg: c,
            rope: &self.ropes.global,
            segs,
            starts,
            rows_pos,
            n,
        };
        for il in 0..c.n_layer {
            if let Some(pg) = pass.as_mut() {
                pg.enter_layer(il)?;
            }
            self.arch.layer(&mut p, s, il);
        }
        finish(&p, s, pass.as_mut())
    }

    fn embed(
        &self,
        tokens: &[u32],
        (vk, segs, starts): (&VecKernels, &[Segment<'_>], &[usize]),
        s: &mut Scratch,
        mut pass: Option<&mut PagerPass<'_>>,
    ) -> Result<()> {
        let (e, n_vocab) = (self.cfg.n_embd, self.cfg.n_vocab);
        let emb = self.tok_embd.view(&self.file);
        let x = fit(&mut s.x, tokens.len() * e);
        for (t, &tok) in tokens.iter().enumerate() {
            let tok = tok as usize;
            if tok >= n_vocab {
                return Err(Error::generate(format!(
                    "token id {tok} is outside the vocabulary of {n_vocab}"
                )));
            }
            dequantize_row(emb.ty, emb.row(tok), &mut x[t * e..(t + 1) * e])?;
            if let Some(pg) = pass.as_deref_mut() {
                let rb = self.tok_embd.nbytes / n_vocab.max(1);
                let at = self.tok_embd.offset + tok * rb;
                pg.after_row(at, at + rb)?;
            }
        }
        lora::apply_embedding(vk, segs, starts, tokens, x);
        if let Some(m) = self.cfg.embed_mul {
            x.iter_mut().for_each(|v| *v *= m);
        }
        Ok(())
    }

    /// Context shift of `kv` (see `KvCache::shift`): each moved key is
    /// rotated back by `discard` positions with the rotary table its layer
    /// used (local or global, the one the context size selects). Only for
    /// causal attention models: a recurrent state cannot drop tokens.
    pub fn shift_kv(
        &self,
        kv: &mut KvCache,
        keep: usize,
        discard: usize,
        n: usize,
        pool: &ThreadPool,
    ) -> Result<()> {
        let c = &self.cfg;
        if c.ssm.is_some() || !c.causal {
            return Err(Error::invalid(format!(
                "context shift is not supported by the {} architecture (it keeps no \
                 per-position key/value cache to shift)",
                c.arch
            )));
        }
        let delta = -(discard as i64);
        let rd = c.rope_dims;
        let (global, local) = (self.ropes.for_context(kv.n_ctx), &self.ropes.local);
        let (mut cs_g, mut cs_l) = (vec![0f32; rd], vec![0f32; rd]);
        global.shift_angles(delta, &mut cs_g);
        local.shift_angles(delta, &mut cs_l);
        // An MLA key row rotates only its tail (after the latent).
        let (off, hd) = (c.kv_rope_offset, c.dim_k - c.kv_rope_offset);
        let rotate = |il: usize, row: &mut [f32]| {
            let row = &mut row[off..];
            if !c.uses_rope(il) {
                // A NoPE layer's keys carry no position to move (llama.cpp
                // 0.3.36 rotates SmolLM3's anyway: its K-shift asks
                // `has_rope`, which its NoPE interval does not set).
            } else if c.is_local_layer(il) {
                local.apply(row, hd, &cs_l);
            } else {
                global.apply(row, hd, &cs_g);
            }
        };
        kv.shift(keep, discard, n, &rotate, pool)
    }

    /// Rotary angles for every row, once per call (not per layer); each
    /// segment uses the table its context size selects.
    fn angles(&self, segs: &[Segment<'_>], starts: &[usize], rows_pos: &[usize], s: &mut Scratch) {
        let c = &self.cfg;
        let (rd, n) = (c.rope_dims, rows_pos.len());
        fit(&mut s.cs, n * rd);
        let has_local = (0..c.n_layer).any(|il| c.is_local_layer(il));
        if has_local {
            fit(&mut s.cs_local, n * rd);
        }
        for (g, seg) in segs.iter().enumerate() {
            let rope = self.ropes.for_context(seg.kv.n_ctx);
            let (a, b) = (starts[g], starts[g + 1]);
            for (t, &pos) in rows_pos.iter().enumerate().take(b).skip(a) {
                rope.angles(pos, &mut s.cs[t * rd..(t + 1) * rd]);
                if has_local {
                    self.ropes
                        .local
                        .angles(pos, &mut s.cs_local[t * rd..(t + 1) * rd]);
                }
            }
        }
    }
}

/// Drops from this process the file pages wholly inside `t`'s data, which
/// the arena is read in place of (the page cache keeps them; a later read
/// faults them back in).
fn release_file_pages(f: &GgufFile, t: &TensorInfo) {
    let ps = crate::gguf::page_size();
    let (a, b) = (
        t.offset.next_multiple_of(ps),
        (t.offset + t.nbytes) / ps * ps,
    );
    if b > a {
        // Advice only: a file read into memory keeps its bytes.
        let _ = f.page(a, b - a, Paging::Unmap);
    }
}

/// Every matrix a decode step streams, onto huge pages (see
/// `gguf::WeightArena`): the decode layout of those the kernels repack on
/// this CPU (`quant::pack_matrix_into`), a copy of the file's bytes for the
/// rest, made in parallel on the pool. Made on the first pass that runs
/// without an offload budget, so a model that always runs under one never
/// holds them.
fn pack_weights(pool: &ThreadPool, f: &GgufFile) -> WeightArena {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    // The embedding table is only read row by row, unless it is also the
    // output head (no `output.weight`).
    let tied = f.tensor("output.weight").is_none();
    // Copies only of a mapped file, whose pages then leave this process; a
    // buffer the caller handed us would be held twice. None either under
    // `OXILLAMA_REPACK=0`, which asks for the file's shared pages.
    let copies = f.is_mapped() && crate::quant::weights_may_move();
    let todo: Vec<(&TensorInfo, usize, Held)> = f
        .tensors()
        .iter()
        .filter(|t| t.dims.len() == 2 && (tied || t.name != "token_embd.weight"))
        .filter_map(
            |t| match crate::quant::packed_len(t.ty, t.n_rows(), t.dims[0] as usize) {
                Some(len) => Some((t, len, Held::Packed)),
                None => copies.then_some((t, t.nbytes, Held::Copy)),
            },
        )
        .collect();
    let wanted: Vec<(usize, usize, Held)> =
        todo.iter().map(|&(t, n, h)| (t.offset, n, h)).collect();
    // Another process of the user that runs this model may have made the
    // arena already (`gguf::shared_arena`): then it is only mapped.
    let place = f
        .mapped_file()
        .filter(|_| weights_shared())
        .and_then(|m| SharedPlace::of(m, &wanted));
    if let Some(arena) = place
        .as_ref()
        .and_then(|p| WeightArena::open_shared(p, &wanted))
    {
        for &(t, _, held) in &todo {
            release_replaced_pages(f, t, held);
        }
        release_tied_table(f, &arena, tied);
        return arena;
    }
    // A failed mapping only leaves every matrix where the file has it.
    let Some(mut arena) = WeightArena::reserve(&wanted) else {
        return WeightArena::default();
    };
    let by_offset: std::collections::HashMap<usize, (&TensorInfo, Held)> =
        todo.iter().map(|&(t, _, h)| (t.offset, (t, h))).collect();
    let parts: Vec<Mutex<(usize, &mut [u8])>> =
        arena.parts_mut().into_iter().map(Mutex::new).collect();
    let failed: Vec<AtomicBool> = parts.iter().map(|_| AtomicBool::new(false)).collect();
    pool.run(parts.len(), |i| {
        let mut part = parts[i].lock().unwrap_or_else(|e| e.into_inner());
        let (offset, ref mut out) = *part;
        let (t, held) = by_offset[&offset];
        let data = f.tensor_data(t);
        let ok = match held {
            Held::Packed => {
                let (cols, rows) = (t.dims[0] as usize, t.n_rows());
                crate::quant::pack_matrix_into(t.ty, rows, cols, data, out)
            }
            Held::Copy => {
                out.copy_from_slice(data);
                true
            }
        };
        if ok {
            // Now, not after the last matrix: the peak resident size then
            // holds one matrix twice, not every copied one.
            release_replaced_pages(f, t, held);
        } else {
            failed[i].store(true, Ordering::Relaxed);
        }
    });
    let failed: Vec<usize> = parts
        .into_iter()
        .zip(failed)
        .filter(|(_, bad)| bad.load(Ordering::Relaxed))
        .map(|(p, _)| p.into_inner().unwrap_or_else(|e| e.into_inner()).0)
        .collect();
    for offset in failed {
        arena.forget(offset);
    }
    release_tied_table(f, &arena, tied);
    if let Some(p) = &place {
        // Best effort: on failure the arena stays this process's own.
        arena.share(p, &wanted);
    }
    arena
}

/// Whether arenas go to a file the user's processes share
/// (`OXILLAMA_SHARE_WEIGHTS=0` keeps each process's own).
fn weights_shared() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::env_switch::on("OXILLAMA_SHARE_WEIGHTS"))
}

/// Drops the file pages of a matrix the arena holds in their place.
fn release_replaced_pages(f: &GgufFile, t: &TensorInfo, held: Held) {
    match held {
        // Where the prefill GEMM reads the packed copy too, nothing reads
        // these file pages again (but the embedding table's rows, looked up
        // one by one).
        Held::Packed => {
            if crate::quant::gemm_reads_packed(t.ty) && t.name != "token_embd.weight" {
                release_file_pages(f, t);
            }
        }
        Held::Copy => release_file_pages(f, t),
    }
}

/// A tied table's file layout serves only embedding lookups, a row per
/// token, once the arena holds its packed head: its pages leave this
/// process (the page cache keeps them and a lookup faults its row back in),
/// so the packed head does not double the resident size. Gemma-3-270M: 178
/// MB of its 246. Other packed matrices keep their file pages: prefill's
/// GEMM reads them.
fn release_tied_table(f: &GgufFile, arena: &WeightArena, tied: bool) {
    if let Some(t) = f
        .tensor("token_embd.weight")
        .filter(|t| tied && arena.get(t.offset, Held::Packed).is_some())
    {
        release_file_pages(f, t);
    }
}
