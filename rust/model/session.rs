//! One inference session: a model, its KV cache and the position reached.

use std::sync::Arc;

use super::forward::Model;
use super::kv_cache::{KvCache, KvTypes};
use super::kv_pool::KvPool;
use super::pass::{Scratch, Segment};
use super::recurrent::Recurrent;
use crate::lora::ActiveLora;
use crate::ops::vec::{self, VecKernels};
use crate::threadpool::{shared_pool, ThreadPool};
use crate::{Error, Result};

pub struct Session {
    pub model: Arc<Model>,
    pool: Arc<ThreadPool>,
    vk: &'static VecKernels,
    pub kv: KvCache,
    /// A recurrent model's state and checkpoints (its `kv` has no layers).
    pub rec: Option<Recurrent>,
    n_past: usize,
    /// Tokens per forward call during prefill; bounds activation memory.
    pub prefill_chunk: usize,
    scratch: Scratch,
    /// Whether `scratch` holds the hidden state of position n_past - 1.
    hidden_valid: bool,
    /// The last logits came from the output head applied to `last_hidden`
    /// (alone, or as one row of a batch: every matmul path gives a row the
    /// same bits either way), so `head_logits` reproduces them exactly.
    logits_from_last_hidden: bool,
    /// Multi-token evals attend row by row with the one-token kernel, so
    /// their logits equal those of one-token evals bit for bit.
    pub exact_rows: bool,
    /// LoRA adapters applied to this session's rows, with their scales.
    loras: Vec<ActiveLora>,
}

impl Session {
    pub fn new(
        model: Arc<Model>,
        n_ctx: usize,
        threads: usize,
        kv_dtype: impl Into<KvTypes>,
    ) -> Result<Self> {
        if n_ctx == 0 {
            return Err(Error::invalid("context_size must be at least 1"));
        }
        let c = &model.cfg;
        let kv = KvCache::for_shape(kv_dtype, c.kv_shape(), n_ctx)?;
        Self::with_kv(model, kv, threads)
    }

    /// A session whose KV pages come from `pool`, shared with other
    /// sessions of the same model (see `kv_pool.rs`).
    pub fn with_pool(
        model: Arc<Model>,
        n_ctx: usize,
        threads: usize,
        pool: Arc<KvPool>,
    ) -> Result<Self> {
        if n_ctx == 0 {
            return Err(Error::invalid("context_size must be at least 1"));
        }
        let c = &model.cfg;
        if pool.shape() != c.kv_shape() {
            return Err(Error::invalid(
                "the KV pool was made for a model of another shape",
            ));
        }
        Self::with_kv(model, KvCache::with_pool(pool, n_ctx), threads)
    }

    fn with_kv(model: Arc<Model>, kv: KvCache, threads: usize) -> Result<Self> {
        let rec = match model.cfg.ssm {
            Some(shape) => {
                let c = &model.cfg;
                let recr: Vec<bool> = (0..c.n_layer).map(|il| c.is_recr_layer(il)).collect();
                Some(Recurrent::new(shape, &recr)?)
            }
            None => None,
        };
        Ok(Session {
            pool: shared_pool(threads),
            vk: vec::best(),
            kv,
            rec,
            n_past: 0,
            prefill_chunk: 512,
            scratch: Scratch::default(),
            hidden_valid: false,
            logits_from_last_hidden: false,
            exact_rows: false,
            loras: Vec::new(),
            model,
        })
    }

    /// Replaces the active adapters (each checked against this model).
    /// The KV cache is left as it is: what it holds was computed with the
    /// adapters active then, as in llama.cpp.
    pub fn set_loras(&mut self, loras: Vec<ActiveLora>) -> Result<()> {
        for l in &loras {
            if !l.adapter.fits(&self.model.file) {
                return Err(Error::lora("the LoRA adapter was loaded for another model"));
            }
            if !l.scale.is_finite() {
                return Err(Error::invalid(format!(
                    "LoRA scale must be finite, got {}",
                    l.scale
                )));
            }
        }
        self.loras = loras;
        Ok(())
    }

    pub fn loras(&self) -> &[ActiveLora] {
        &self.loras
    }

    pub fn n_past(&self) -> usize {
        self.n_past
    }

    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx
    }

    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// The threads this session's pool ran its last dispatch on: `threads`,
    /// or its share of the cores while other oxillama processes use them.
    pub fn threads_in_use(&self) -> usize {
        self.pool.threads_in_use()
    }

    pub fn set_threads(&mut self, threads: usize) {
        self.pool = shared_pool(threads);
    }

    /// The counters of this session's thread pool (shared by the sessions
    /// of the process that use as many threads).
    pub fn pool_stats(&self) -> crate::threadpool::PoolStats {
        self.pool.stats()
    }

    /// Appends `tokens` to the context and returns the logits of the last
    /// one (`n_vocab`), or of each (`len x n_vocab`). On error the session
    /// is unchanged: everything is validated before any KV write.
    pub fn eval(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::generate("eval needs at least one token"));
        }
        let n_vocab = self.model.n_vocab();
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(Error::generate(format!(
                "token id {bad} is outside the vocabulary of {n_vocab}"
            )));
        }
        let need = self.n_past + tokens.len();
        if need > self.n_ctx() {
            return Err(Error::generate(format!(
                "context overflow: {} tokens in the context + {} new tokens = {need} exceeds the context size of {}",
                self.n_past,
                tokens.len(),
                self.n_ctx()
            )));
        }
        // Every page the call needs is taken up front, so a full pool fails
        // it before anything changed.
        self.kv.reserve(self.n_past, need)?;
        // A recurrent state can only return to positions it was copied at:
        // the start of this call, and with exact rows (speculative
        // verification) every token, which then runs one at a time.
        let mut chunk = self.prefill_chunk.max(1);
        if let Some(r) = &mut self.rec {
            r.checkpoint(self.n_past);
            if self.exact_rows {
                chunk = 1;
            }
        }
        let mut out = Vec::with_capacity(if all_logits {
            tokens.len() * n_vocab
        } else {
            n_vocab
        });
        let mut logits = Vec::new();
        let n_chunks = tokens.len().div_ceil(chunk);
        for (i, part) in tokens.chunks(chunk).enumerate() {
            let last = i + 1 == n_chunks;
            let mut segs = [Segment {
                kv: &mut self.kv,
                tokens: part,
                pos0: self.n_past,
                decode_rows: self.exact_rows,
                all_rows: false,
                rec: self.rec.as_mut().map(|r| &mut r.state),
                lora: &self.loras,
            }];
            self.model.forward_segments(
                &self.pool,
                self.vk,
                &mut segs,
                all_logits,
                &mut self.scratch,
                &mut logits,
            )?;
            self.n_past += part.len();
            if let (Some(r), true) = (&mut self.rec, self.exact_rows && !last) {
                r.checkpoint(self.n_past);
            }
            if all_logits || last {
                out.extend_from_slice(&logits);
            }
        }
        self.hidden_valid = true;
        // One segment without all_logits sends exactly one row through the
        // head (see `forward_segments`).
        self.logits_from_last_hidden = !all_logits;
        Ok(out)
    }

    /// Forgets every position from `n` on.
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        if n > self.n_past {
            return Err(Error::invalid(format!(
                "cannot truncate to {n}: only {} tokens in the context",
                self.n_past
            )));
        }
        if let Some(r) = &mut self.rec {
            r.rollback(self.n_past, n)?;
        }
        if n != self.n_past {
            self.hidden_valid = false;
        }
        self.n_past = n;
        self.kv.truncate(n);
        Ok(())
    }

    /// Context shift, as llama.cpp's: keeps the first `keep` positions,
    /// forgets the `discard` after them and moves the rest down, re-rotating
    /// their keys, so the context then holds `n_past - discard` positions
    /// and the next token goes at that position. The next-token logits (and
    /// the last hidden state) stay valid: they are what the model computed
    /// before the shift, as in llama.cpp, which samples them after it.
    pub fn shift(&mut self, keep: usize, discard: usize) -> Result<()> {
        if keep + discard > self.n_past {
            return Err(Error::invalid(format!(
                "cannot shift: keep {keep} + discard {discard} exceeds the {} tokens in the context",
                self.n_past
            )));
        }
        self.model
            .shift_kv(&mut self.kv, keep, discard, self.n_past, &self.pool)?;
        self.n_past -= discard;
        Ok(())
    }

    /// Whether `truncate(n)` can succeed (a recurrent model returns only to
    /// the positions it kept its state at).
    pub fn can_truncate(&self, n: usize) -> bool {
        n <= self.n_past
            && self
                .rec
                .as_ref()
                .is_none_or(|r| r.can_rollback(self.n_past, n))
    }

    pub fn reset(&mut self) {
        self.n_past = 0;
        self.hidden_valid = false;
        self.kv.truncate(0);
        if let Some(r) = &mut self.rec {
            // Rolling back to 0 cannot fail.
            let _ = r.rollback(1, 0);
        }
    }

    /// The last position's normalized hidden state (what the output head
    /// multiplies), while it is current.
    pub fn last_hidden(&self) -> Option<&[f32]> {
        let e = self.model.cfg.n_embd;
        self.scratch
            .last_hidden(e)
            .filter(|_| self.hidden_valid && self.n_past > 0)
    }

    /// Frees the activation buffers of the last forward pass, keeping
    /// `last_hidden` (they are allocated again by the next one).
    pub fn release_scratch(&mut self) {
        self.scratch.shrink_to_last(self.model.cfg.n_embd);
    }

    /// Whether `head_logits(last_hidden())` is the last `eval`'s logits by
    /// construction (no need to recompute them to check).
    pub fn logits_from_head(&self) -> bool {
        self.logits_from_last_hidden && self.last_hidden().is_some()
    }

    /// Logits of a hidden state from `last_hidden`, bit-identical to those
    /// `eval` returned for it.
    pub fn head_logits(&mut self, hidden: &[f32]) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        self.model.head(
            &self.pool,
            hidden,
            &self.loras,
            &mut self.scratch,
            &mut logits,
        )?;
        Ok(logits)
    }

    /// The KV cache up to the current position, as raw little-endian bytes
    /// (a recurrent model's state instead: it is what a session carries; a
    /// hybrid's KV rows, then its recurrent state).
    pub fn export_kv(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.export_kv_len()];
        self.export_kv_into(&mut out)?;
        Ok(out)
    }

    /// Size in bytes of `export_kv()`.
    pub fn export_kv_len(&self) -> usize {
        match &self.rec {
            Some(r) if self.model.cfg.is_hybrid() => {
                self.kv.export_len(self.n_past) + r.state.export_len()
            }
            Some(r) => r.state.export_len(),
            None => self.kv.export_len(self.n_past),
        }
    }

    /// `export_kv` into a buffer of exactly `export_kv_len()` bytes.
    pub fn export_kv_into(&self, out: &mut [u8]) -> Result<()> {
        match &self.rec {
            Some(r) if self.model.cfg.is_hybrid() => {
                let kv_len = self.kv.export_len(self.n_past);
                if out.len() != kv_len + r.state.export_len() {
                    return Err(Error::invalid(format!(
                        "session export needs {} bytes, got a buffer of {}",
                        kv_len + r.state.export_len(),
                        out.len()
                    )));
                }
                let (kv, rec) = out.split_at_mut(kv_len);
                self.kv.export_into(self.n_past, kv, &self.pool)?;
                r.state.export_into(rec)
            }
            Some(r) => r.state.export_into(out),
            None => self.kv.export_into(self.n_past, out, &self.pool),
        }
    }

    /// Replaces the context with `n` positions of exported KV data (or a
    /// recurrent state at position `n`). On error the session keeps its
    /// previous position (its cache may be partly overwritten only after
    /// validation passed, which cannot fail midway).
    pub fn import_kv(&mut self, n: usize, data: &[u8]) -> Result<()> {
        let hybrid = self.model.cfg.is_hybrid();
        match &mut self.rec {
            Some(r) if hybrid => {
                let rec_len = r.state.export_len();
                let Some(kv_len) = data.len().checked_sub(rec_len) else {
                    return Err(Error::invalid(format!(
                        "session data has {} bytes, less than this model's recurrent state of {rec_len}",
                        data.len()
                    )));
                };
                // The state is checked in a copy first, so a bad one
                // leaves the session as it was.
                let mut state = r.state.clone();
                state.import(&data[kv_len..])?;
                self.kv.import(n, &data[..kv_len], &self.pool)?;
                r.state = state;
                r.forget_checkpoints();
            }
            Some(r) => {
                if n > self.kv.n_ctx {
                    return Err(Error::invalid(format!(
                        "{n} positions do not fit a context of {}",
                        self.kv.n_ctx
                    )));
                }
                self.kv.reserve(0, n)?;
                r.state.import(data)?;
                r.forget_checkpoints();
            }
            None => self.kv.import(n, data, &self.pool)?,
        }
        self.n_past = n;
        self.hidden_valid = false;
        Ok(())
    }

    /// Keeps the first `start` positions and appends the positions of
    /// `blocks` (each `(p, export of p positions)`), as the prefix store
    /// restores its blocks: straight from each block's bytes, with no
    /// joined copy and nothing before `start` written again. Models with
    /// a recurrent state are refused (their state is not kept per block).
    /// On error the session is unchanged.
    pub fn import_kv_at(&mut self, start: usize, blocks: &[(usize, &[u8])]) -> Result<()> {
        if self.rec.is_some() {
            return Err(Error::invalid(
                "a model with a recurrent state cannot import KV blocks",
            ));
        }
        if start > self.n_past {
            return Err(Error::invalid(format!(
                "cannot import at position {start}: the context holds {}",
                self.n_past
            )));
        }
        self.kv.import_at(start, blocks, &self.pool)?;
        self.n_past = start + blocks.iter().map(|b| b.0).sum::<usize>();
        self.hidden_valid = false;
        Ok(())
    }

    /// A session on the same KV pool whose first `n` positions are this
    /// one's, holding the same pages (copied on the first write into one).
    pub fn fork(&self, n: usize) -> Result<Session> {
        if n > self.n_past {
            return Err(Error::invalid(format!(
                "cannot fork {n} positions: only {} are in the context",
                self.n_past
            )));
        }
        let rec = match &self.rec {
            Some(r) => Some(r.fork(self.n_past, n)?),
            None => None,
        };
        let mut s = Self::with_kv(Arc::clone(&self.model), self.kv.fork(n)?, self.threads())?;
        s.rec = rec;
        s.n_past = n;
        s.prefill_chunk = self.prefill_chunk;
        s.loras = self.loras.clone();
        Ok(s)
    }

    /// Appends `tokens[i]` to `sessions[i]` for every session in one
    /// forward pass (the sessions must share one model) and returns the
    /// logits of each one's last new token, or of every new token for a
    /// session whose `all_rows[i]` is set (`rows x n_vocab`, session after
    /// session; an empty `all_rows` means none). Everything is validated
    /// first, so on error no session changed.
    pub fn eval_batch(
        sessions: &mut [&mut Session],
        tokens: &[Vec<u32>],
        all_rows: &[bool],
    ) -> Result<Vec<f32>> {
        if sessions.is_empty() || sessions.len() != tokens.len() {
            return Err(Error::invalid(format!(
                "eval_batch needs one token list per session ({} sessions, {} lists)",
                sessions.len(),
                tokens.len()
            )));
        }
        if !all_rows.is_empty() && all_rows.len() != sessions.len() {
            return Err(Error::invalid(format!(
                "eval_batch needs one all_logits flag per session ({} sessions, {} flags)",
                sessions.len(),
                all_rows.len()
            )));
        }
        let wants_all = |i: usize| all_rows.get(i).copied().unwrap_or(false);
        let model = Arc::clone(&sessions[0].model);
        let n_vocab = model.n_vocab();
        for (s, toks) in sessions.iter().zip(tokens) {
            if !Arc::ptr_eq(&s.model, &model) {
                return Err(Error::invalid("eval_batch sessions must share one model"));
            }
            if toks.is_empty() {
                return Err(Error::generate(
                    "eval_batch needs at least one token per session",
                ));
            }
            if let Some(&bad) = toks.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(Error::generate(format!(
                    "token id {bad} is outside the vocabulary of {n_vocab}"
                )));
            }
            if s.n_past + toks.len() > s.n_ctx() {
                return Err(Error::generate(format!(
                    "context overflow: {} + {} tokens exceeds the context size of {}",
                    s.n_past,
                    toks.len(),
                    s.n_ctx()
                )));
            }
        }
        for (s, toks) in sessions.iter_mut().zip(tokens) {
            let from = s.n_past;
            s.kv.reserve(from, from + toks.len())?;
        }
        for s in sessions.iter_mut() {
            let at = s.n_past;
            if let Some(r) = &mut s.rec {
                r.checkpoint(at);
            }
        }
        let pool = Arc::clone(&sessions[0].pool);
        let vk = sessions[0].vk;
        let mut scratch = std::mem::take(&mut sessions[0].scratch);
        let mut logits = Vec::new();
        let res = {
            let mut segs: Vec<Segment<'_>> = sessions
                .iter_mut()
                .zip(tokens)
                .enumerate()
                .map(|(i, (s, toks))| Segment {
                    pos0: s.n_past,
                    decode_rows: s.exact_rows,
                    all_rows: wants_all(i),
                    kv: &mut s.kv,
                    tokens: toks,
                    rec: s.rec.as_mut().map(|r| &mut r.state),
                    lora: &s.loras,
                })
                .collect();
            model.forward_segments(&pool, vk, &mut segs, false, &mut scratch, &mut logits)
        };
        res?;
        // Session i's last head row is its last hidden state. Each session
        // keeps its own (n_embd floats), so a session that waits after a
        // batched step can hold it instead of its logits: every matmul path
        // forms the same bits for a row alone or in a batch, so
        // `head_logits` of it gives these logits again.
        let e = model.cfg.n_embd;
        let mut last_rows = Vec::with_capacity(tokens.len());
        let mut row = 0;
        for (i, toks) in tokens.iter().enumerate() {
            row += if wants_all(i) { toks.len() } else { 1 };
            last_rows.push(row - 1);
        }
        for (i, s) in sessions.iter_mut().enumerate().skip(1) {
            s.scratch
                .set_last_hidden(scratch.row_hidden(last_rows[i], e));
        }
        scratch.keep_row_hidden(last_rows[0], e);
        sessions[0].scratch = scratch;
        for (s, toks) in sessions.iter_mut().zip(tokens) {
            s.n_past += toks.len();
            s.hidden_valid = true;
            s.logits_from_last_hidden = true;
        }
        Ok(logits)
    }
}
