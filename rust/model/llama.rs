//! The llama-family transformer: llama, mistral, qwen2/3 and gemma3 differ
//! only in the `ArchTraits` switches read here.

use std::sync::Arc;

use super::config::{Activation, ModelConfig};
use super::kv_cache::KvCache;
use super::weights::{matrix, opt_vector, vector, LayerWeights, MatRef};
use crate::gguf::GgufFile;
use crate::ops::activation::{geglu, swiglu};
use crate::ops::attention::{attention, decode_many, AttnParams, DecodeRow};
use crate::ops::matmul::{matmul, matmul_multi, ActScratch};
use crate::ops::norm::{rms_norm, rms_norm_inplace};
use crate::ops::rope::{Rope, RopeScaling};
use crate::ops::vec::VecKernels;
use crate::quant::dequantize_row;
use crate::threadpool::ThreadPool;
use crate::{Error, Result};

/// One sequence of a batched forward pass.
pub struct Segment<'a> {
    pub kv: &'a mut KvCache,
    pub tokens: &'a [u32],
    /// Position of the first token.
    pub pos0: usize,
    /// Attend token by token with the one-token kernel, so each row's
    /// logits are bit-identical to evaluating the tokens one at a time
    /// (speculative verification relies on it).
    pub decode_rows: bool,
}

pub struct Model {
    pub file: Arc<GgufFile>,
    pub cfg: ModelConfig,
    tok_embd: MatRef,
    output: MatRef,
    output_norm: Vec<f32>,
    layers: Vec<LayerWeights>,
    rope: Rope,
    rope_local: Rope,
}

/// Activation buffers for one forward chunk, reused across calls.
#[derive(Default)]
pub struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    cs: Vec<f32>,
    cs_local: Vec<f32>,
    acts: ActScratch,
}

impl Scratch {
    /// The last position's hidden state after the output norm, as the last
    /// forward left it (`n_embd` floats), if any.
    pub fn last_hidden(&self, n_embd: usize) -> Option<&[f32]> {
        (n_embd > 0 && self.h.len() >= n_embd).then(|| &self.h[self.h.len() - n_embd..])
    }

    /// The hidden state of head row `i` after a forward pass (one row per
    /// segment when not all logits were asked for).
    pub fn row_hidden(&self, i: usize, n_embd: usize) -> &[f32] {
        self.h.get(i * n_embd..(i + 1) * n_embd).unwrap_or(&[])
    }

    /// Makes `last_hidden` return `hidden` (a row taken from a batch).
    pub fn set_last_hidden(&mut self, hidden: &[f32]) {
        self.h.clear();
        self.h.extend_from_slice(hidden);
    }

    /// Keeps only head row 0 as the last hidden state.
    pub fn keep_first_row_hidden(&mut self, n_embd: usize) {
        self.h.truncate(n_embd);
    }

    /// Frees every buffer but the last position's hidden state, which
    /// stays readable through `last_hidden`. An idle session then costs its
    /// KV pages and `n_embd` floats, not a chunk's activations.
    pub fn shrink_to_last(&mut self, n_embd: usize) {
        let keep = self.last_hidden(n_embd).map(<[f32]>::to_vec);
        *self = Scratch::default();
        self.h = keep.unwrap_or_default();
    }
}

fn fit(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    v.resize(n, 0.0);
    &mut v[..n]
}

impl Model {
    pub fn load(file: Arc<GgufFile>) -> Result<Self> {
        let mut cfg = ModelConfig::from_gguf(&file)?;
        let f = &*file;
        let (e, ff) = (cfg.n_embd, cfg.n_ff);
        let tok_embd = matrix(f, "token_embd.weight", e, None)?;
        cfg.n_vocab = tok_embd.rows;
        let output = if f.tensor("output.weight").is_some() {
            matrix(f, "output.weight", e, Some(cfg.n_vocab))?
        } else {
            tok_embd
        };
        let output_norm = vector(f, "output_norm.weight", e)?;
        let (qd, kd, vd) = (
            cfg.n_head * cfg.dim_k,
            cfg.n_head_kv * cfg.dim_k,
            cfg.n_head_kv * cfg.dim_v,
        );
        let od = cfg.n_head * cfg.dim_v;
        let t = &cfg.traits;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for il in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            let b = |s: &str| format!("blk.{il}.{s}.bias");
            layers.push(LayerWeights {
                attn_norm: vector(f, &n("attn_norm"), e)?,
                wq: matrix(f, &n("attn_q"), e, Some(qd))?,
                wk: matrix(f, &n("attn_k"), e, Some(kd))?,
                wv: matrix(f, &n("attn_v"), e, Some(vd))?,
                wo: matrix(f, &n("attn_output"), od, Some(e))?,
                bq: if t.qkv_bias {
                    opt_vector(f, &b("attn_q"), qd)?
                } else {
                    None
                },
                bk: if t.qkv_bias {
                    opt_vector(f, &b("attn_k"), kd)?
                } else {
                    None
                },
                bv: if t.qkv_bias {
                    opt_vector(f, &b("attn_v"), vd)?
                } else {
                    None
                },
                q_norm: if t.qk_norm {
                    Some(vector(f, &n("attn_q_norm"), cfg.dim_k)?)
                } else {
                    None
                },
                k_norm: if t.qk_norm {
                    Some(vector(f, &n("attn_k_norm"), cfg.dim_k)?)
                } else {
                    None
                },
                post_attn_norm: if t.post_norms {
                    Some(vector(f, &n("post_attention_norm"), e)?)
                } else {
                    None
                },
                ffn_norm: vector(f, &n("ffn_norm"), e)?,
                gate: matrix(f, &n("ffn_gate"), e, Some(ff))?,
                up: matrix(f, &n("ffn_up"), e, Some(ff))?,
                down: matrix(f, &n("ffn_down"), ff, Some(e))?,
                post_ffn_norm: if t.post_norms {
                    Some(vector(f, &n("post_ffw_norm"), e)?)
                } else {
                    None
                },
            });
        }
        let rope = Rope::new(
            t.rope_order,
            cfg.rope_dims,
            cfg.rope_base,
            &cfg.rope_scaling,
        );
        let rope_local = Rope::new(
            t.rope_order,
            cfg.rope_dims,
            cfg.rope_base_local,
            &RopeScaling::None,
        );
        Ok(Model {
            file,
            cfg,
            tok_embd,
            output,
            output_norm,
            layers,
            rope,
            rope_local,
        })
    }

    /// The output head alone: logits of one normalized hidden state, with
    /// the same kernels (hence bits) as the end of `forward`.
    pub fn head(
        &self,
        pool: &ThreadPool,
        hidden: &[f32],
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
        matmul(
            pool,
            self.output.view(&self.file),
            hidden,
            1,
            logits,
            &mut s.acts,
        );
        Ok(())
    }

    pub fn n_vocab(&self) -> usize {
        self.cfg.n_vocab
    }

    /// Runs `tokens` (positions `pos0..`) through the network, storing their
    /// keys and values in `kv`. Writes logits for the last token, or for
    /// every token when `all_logits`, into `logits` (`n x n_vocab`).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        pool: &ThreadPool,
        vk: &VecKernels,
        kv: &mut KvCache,
        tokens: &[u32],
        pos0: usize,
        all_logits: bool,
        s: &mut Scratch,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let mut segs = [Segment {
            kv,
            tokens,
            pos0,
            decode_rows: false,
        }];
        self.forward_segments(pool, vk, &mut segs, all_logits, s, logits)
    }

    /// One forward pass over several sequences at once, each with its own
    /// KV cache and position: the weight matrices are read once for all
    /// their tokens (a GEMM over the batch), attention runs per sequence.
    /// Writes the last token's logits of each segment (`segs.len() x
    /// n_vocab`), or with a single segment and `all_logits` every token's.
    pub fn forward_segments(
        &self,
        pool: &ThreadPool,
        vk: &VecKernels,
        segs: &mut [Segment<'_>],
        all_logits: bool,
        s: &mut Scratch,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        if segs.iter().any(|g| g.tokens.is_empty()) || segs.is_empty() {
            return Err(Error::generate("forward called with no tokens"));
        }
        let all_logits = all_logits && segs.len() == 1;
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
        let f = &*self.file;
        let n = tokens.len();
        let (e, ff) = (c.n_embd, c.n_ff);
        let (qd, kd, vd) = (
            c.n_head * c.dim_k,
            c.n_head_kv * c.dim_k,
            c.n_head_kv * c.dim_v,
        );
        let od = c.n_head * c.dim_v;

        // Embeddings.
        let emb = self.tok_embd.view(f);
        let x = fit(&mut s.x, n * e);
        for (t, &tok) in tokens.iter().enumerate() {
            let tok = tok as usize;
            if tok >= c.n_vocab {
                return Err(Error::generate(format!(
                    "token id {tok} is outside the vocabulary of {}",
                    c.n_vocab
                )));
            }
            dequantize_row(emb.ty, emb.row(tok), &mut x[t * e..(t + 1) * e])?;
        }
        if c.traits.scale_embeddings {
            let sc = (e as f32).sqrt();
            x.iter_mut().for_each(|v| *v *= sc);
        }

        // Rotary angles for every position, once per call (not per layer).
        let rd = c.rope_dims;
        fit(&mut s.cs, n * rd);
        for (t, &pos) in rows_pos.iter().enumerate() {
            self.rope.angles(pos, &mut s.cs[t * rd..(t + 1) * rd]);
        }
        let has_local = (0..c.n_layer).any(|il| c.is_local_layer(il));
        if has_local {
            fit(&mut s.cs_local, n * rd);
            for (t, &pos) in rows_pos.iter().enumerate() {
                self.rope_local
                    .angles(pos, &mut s.cs_local[t * rd..(t + 1) * rd]);
            }
        }

        for (il, l) in self.layers.iter().enumerate() {
            let local = c.is_local_layer(il);
            rms_norm(&s.x, &l.attn_norm, c.rms_eps, 0.0, fit(&mut s.h, n * e));
            fit(&mut s.q, n * qd);
            fit(&mut s.k, n * kd);
            fit(&mut s.v, n * vd);
            matmul_multi(
                pool,
                &[l.wq.view(f), l.wk.view(f), l.wv.view(f)],
                &s.h,
                n,
                &mut [&mut s.q[..], &mut s.k[..], &mut s.v[..]],
                &mut s.acts,
            );
            for (buf, bias, d) in [
                (&mut s.q, &l.bq, qd),
                (&mut s.k, &l.bk, kd),
                (&mut s.v, &l.bv, vd),
            ] {
                if let Some(b) = bias {
                    for row in buf.chunks_exact_mut(d) {
                        row.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                    }
                }
            }
            if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
                rms_norm_inplace(&mut s.q, qn, c.rms_eps, 0.0);
                rms_norm_inplace(&mut s.k, kn, c.rms_eps, 0.0);
            }
            let (rope, cs) = if local {
                (&self.rope_local, &s.cs_local)
            } else {
                (&self.rope, &s.cs)
            };
            for (g, seg) in segs.iter_mut().enumerate() {
                for t in starts[g]..starts[g + 1] {
                    let a = &cs[t * rd..(t + 1) * rd];
                    rope.apply(&mut s.q[t * qd..(t + 1) * qd], c.dim_k, a);
                    rope.apply(&mut s.k[t * kd..(t + 1) * kd], c.dim_k, a);
                    seg.kv.store(
                        il,
                        rows_pos[t],
                        &s.k[t * kd..(t + 1) * kd],
                        &s.v[t * vd..(t + 1) * vd],
                    );
                }
            }
            let p = AttnParams {
                n_head: c.n_head,
                n_head_kv: c.n_head_kv,
                dim_k: c.dim_k,
                dim_v: c.dim_v,
                scale: c.attn_scale,
                window: if local { c.sliding_window } else { None },
            };
            fit(&mut s.att, n * od);
            // Multi-token segments (prefill) attend as blocks; every
            // single-token row (decode, and rows attended one by one) goes
            // into one batched decode, two pool dispatches for the layer
            // instead of two per row.
            let one_by_one = |seg: &Segment<'_>, a: usize, b: usize| b - a == 1 || seg.decode_rows;
            for (g, seg) in segs.iter().enumerate() {
                let (a, b) = (starts[g], starts[g + 1]);
                if !one_by_one(seg, a, b) {
                    attention(
                        pool,
                        vk,
                        seg.kv,
                        il,
                        &s.q[a * qd..b * qd],
                        seg.pos0,
                        b - a,
                        &p,
                        &mut s.att[a * od..b * od],
                    );
                }
            }
            let mut outs: Vec<Option<&mut [f32]>> = s.att.chunks_exact_mut(od).map(Some).collect();
            let mut rows = Vec::new();
            for (g, seg) in segs.iter().enumerate() {
                let (a, b) = (starts[g], starts[g + 1]);
                if one_by_one(seg, a, b) {
                    for t in a..b {
                        if let Some(out) = outs[t].take() {
                            rows.push(DecodeRow {
                                cache: &*seg.kv,
                                q: &s.q[t * qd..(t + 1) * qd],
                                pos: rows_pos[t],
                                out,
                            });
                        }
                    }
                }
            }
            if !rows.is_empty() {
                decode_many(pool, vk, il, &p, &mut rows);
            }
            matmul(
                pool,
                l.wo.view(f),
                &s.att,
                n,
                fit(&mut s.o, n * e),
                &mut s.acts,
            );
            if let Some(w) = &l.post_attn_norm {
                rms_norm_inplace(&mut s.o, w, c.rms_eps, 0.0);
            }
            s.x.iter_mut().zip(&s.o).for_each(|(a, b)| *a += b);

            rms_norm(&s.x, &l.ffn_norm, c.rms_eps, 0.0, fit(&mut s.h, n * e));
            fit(&mut s.gate, n * ff);
            fit(&mut s.up, n * ff);
            matmul_multi(
                pool,
                &[l.gate.view(f), l.up.view(f)],
                &s.h,
                n,
                &mut [&mut s.gate[..], &mut s.up[..]],
                &mut s.acts,
            );
            match c.traits.activation {
                Activation::Silu => swiglu(pool, &mut s.gate, &s.up),
                Activation::GeluTanh => geglu(&mut s.gate, &s.up),
            }
            matmul(
                pool,
                l.down.view(f),
                &s.gate,
                n,
                fit(&mut s.o, n * e),
                &mut s.acts,
            );
            if let Some(w) = &l.post_ffn_norm {
                rms_norm_inplace(&mut s.o, w, c.rms_eps, 0.0);
            }
            s.x.iter_mut().zip(&s.o).for_each(|(a, b)| *a += b);
        }

        // Only the rows whose logits are wanted go through the output head,
        // which is the largest matrix of a small model.
        let picked: Vec<usize> = if all_logits {
            (0..n).collect()
        } else {
            starts[1..].iter().map(|&end| end - 1).collect()
        };
        let rows = picked.len();
        fit(&mut s.h, rows * e);
        for (r, &t) in picked.iter().enumerate() {
            rms_norm(
                &s.x[t * e..(t + 1) * e],
                &self.output_norm,
                c.rms_eps,
                0.0,
                &mut s.h[r * e..(r + 1) * e],
            );
        }
        logits.resize(rows * c.n_vocab, 0.0);
        matmul(pool, self.output.view(f), &s.h, rows, logits, &mut s.acts);
        Ok(())
    }
}
