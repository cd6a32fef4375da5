//! The self-attention block: projections (separate or fused q/k/v, with
//! optional biases), optional per-head q/k norms, RoPE (skipped on NoPE
//! layers), the KV write, the attention itself (with optional per-head
//! sinks), and the output projection.
//!
//! A cache that stores its rows Hadamard-rotated (`KvRot`, on by default
//! for quantized sides, as llama.cpp) gets them rotated here, after RoPE:
//! keys with the queries that meet them, values before they are stored and
//! the attention output back after (the rotation is its own inverse).

use super::add::add_bias;
use super::norm::Norm;
use crate::lora;
use crate::model::config::{ModelConfig, NormKind};
use crate::model::pass::{fit, Pass, Scratch, Segment};
use crate::model::weights::{MatRef, Tensors};
use crate::ops::attention::{attention, decode_many, AttnParams, DecodeRow};
use crate::ops::hadamard;
use crate::ops::matmul::{matmul, matmul_multi};
use crate::ops::norm::rms_norm_inplace;
use crate::Error;
use crate::Result;

pub enum Qkv {
    Split {
        q: MatRef,
        k: MatRef,
        v: MatRef,
    },
    /// One `attn_qkv` matrix whose rows are q, then k, then v (Phi-3).
    Fused(MatRef),
}

/// What an architecture's attention block has beyond q/k/v/o.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttnOpts {
    /// q/k/v biases are read when present (Qwen2, StarCoder2).
    pub qkv_bias: bool,
    /// Per-head norms of q and k before RoPE, of this kind.
    pub qk_norm: Option<NormKind>,
    /// The q/k norms may be absent (Command-R has them only in some sizes).
    pub qk_norm_optional: bool,
    /// The q/k norms normalize each token's whole projection, not each
    /// head (OLMo 2).
    pub qk_norm_whole: bool,
    /// An `attn_output` bias is read when present.
    pub out_bias: bool,
    /// `attn_qkv` when the file has it instead of separate matrices.
    pub fused_qkv: bool,
    /// Per-head `attn_sinks` logits join each softmax (gpt-oss).
    pub sinks: bool,
    /// Each value head is RMS-normalized, without a weight (Gemma-3n).
    pub v_norm: bool,
}

pub struct AttnWeights {
    whole_qk_norm: bool,
    qkv: Qkv,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    q_norm: Option<Norm>,
    k_norm: Option<Norm>,
    wo: MatRef,
    bo: Option<Vec<f32>>,
    sinks: Option<Vec<f32>>,
    /// Unit weights of the weightless value norm (a product by 1 is exact).
    v_norm: Option<Vec<f32>>,
}

impl AttnWeights {
    pub fn load(t: &Tensors<'_>, cfg: &ModelConfig, opts: AttnOpts) -> Result<Self> {
        let e = cfg.n_embd;
        let (qd, kd, vd, od) = cfg.attn_dims();
        let qkv = if opts.fused_qkv && t.has("attn_qkv") {
            Qkv::Fused(t.matrix("attn_qkv", e, qd + kd + vd)?)
        } else {
            Qkv::Split {
                q: t.matrix("attn_q", e, qd)?,
                k: t.matrix("attn_k", e, kd)?,
                v: t.matrix("attn_v", e, vd)?,
            }
        };
        let bias = |name: &str, len: usize| -> Result<Option<Vec<f32>>> {
            if opts.qkv_bias {
                t.opt_bias(name, len)
            } else {
                Ok(None)
            }
        };
        if matches!(qkv, Qkv::Fused(_)) {
            // llama.cpp adds separate q/k/v biases after a fused product;
            // we read only a fused bias, so a file with both is refused.
            for name in ["attn_q", "attn_k", "attn_v"] {
                let b = t.bias_name(name);
                if t.f.tensor(&b).is_some() {
                    return Err(Error::load(format!(
                        "{b} beside a fused attn_qkv is not supported (only attn_qkv.bias is)"
                    )));
                }
            }
        }
        let (bq, bk, bv) = match (&qkv, opts.qkv_bias) {
            (Qkv::Fused(_), true) => match t.opt_bias("attn_qkv", qd + kd + vd)? {
                Some(b) => (
                    Some(b[..qd].to_vec()),
                    Some(b[qd..qd + kd].to_vec()),
                    Some(b[qd + kd..].to_vec()),
                ),
                None => (None, None, None),
            },
            _ => (
                bias("attn_q", qd)?,
                bias("attn_k", kd)?,
                bias("attn_v", vd)?,
            ),
        };
        let head_norm = |name: &str, heads: usize| -> Result<Option<Norm>> {
            match opts.qk_norm {
                Some(_) if opts.qk_norm_optional && !t.has(name) => Ok(None),
                Some(kind) if opts.qk_norm_whole => {
                    Norm::load(t, name, cfg.dim_k * heads, kind, cfg.norm_eps).map(Some)
                }
                Some(kind) => {
                    // One weight for all heads, or one per head.
                    let len = match t.n_elements(name) {
                        Some(n) if n == cfg.dim_k * heads => n,
                        _ => cfg.dim_k,
                    };
                    Norm::load(t, name, len, kind, cfg.norm_eps).map(Some)
                }
                None => Ok(None),
            }
        };
        Ok(AttnWeights {
            whole_qk_norm: opts.qk_norm_whole,
            qkv,
            bq,
            bk,
            bv,
            q_norm: head_norm("attn_q_norm", cfg.n_head)?,
            k_norm: head_norm("attn_k_norm", cfg.n_head_kv)?,
            wo: t.matrix("attn_output", od, e)?,
            bo: if opts.out_bias {
                t.opt_bias("attn_output", e)?
            } else {
                None
            },
            sinks: if opts.sinks {
                Some(t.vector("attn_sinks", cfg.n_head)?)
            } else {
                None
            },
            v_norm: opts.v_norm.then(|| vec![1.0; cfg.dim_v]),
        })
    }

    /// `s.h` (`n x n_embd`, normalized) through attention into `s.o`.
    pub fn forward(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        let c = p.cfg;
        let (n, f) = (p.n, p.file);
        let (qd, kd, vd, od) = c.attn_dims();
        let local = c.is_local_layer(il);
        // A layer sharing an earlier layer's cache needs only its queries.
        let shared = c.shares_kv(il);
        fit(&mut s.q, n * qd);
        fit(&mut s.k, n * kd);
        fit(&mut s.v, n * vd);
        match &self.qkv {
            Qkv::Split { q, .. } if shared => {
                matmul(p.pool, q.view(f), &s.h, n, &mut s.q, &mut s.acts);
                lora::apply(p, q, &s.h, &mut s.q);
            }
            Qkv::Split { q, k, v } => {
                matmul_multi(
                    p.pool,
                    &[q.view(f), k.view(f), v.view(f)],
                    &s.h,
                    n,
                    &mut [&mut s.q[..], &mut s.k[..], &mut s.v[..]],
                    &mut s.acts,
                );
                lora::apply(p, q, &s.h, &mut s.q);
                lora::apply(p, k, &s.h, &mut s.k);
                lora::apply(p, v, &s.h, &mut s.v);
            }
            Qkv::Fused(w) => {
                let wd = qd + kd + vd;
                matmul(
                    p.pool,
                    w.view(f),
                    &s.h,
                    n,
                    fit(&mut s.att, n * wd),
                    &mut s.acts,
                );
                lora::apply(p, w, &s.h, &mut s.att);
                for (t, row) in s.att.chunks_exact(wd).enumerate() {
                    s.q[t * qd..(t + 1) * qd].copy_from_slice(&row[..qd]);
                    s.k[t * kd..(t + 1) * kd].copy_from_slice(&row[qd..qd + kd]);
                    s.v[t * vd..(t + 1) * vd].copy_from_slice(&row[qd + kd..]);
                }
            }
        }
        for (buf, bias) in [
            (&mut s.q, &self.bq),
            (&mut s.k, &self.bk),
            (&mut s.v, &self.bv),
        ] {
            if let Some(b) = bias {
                add_bias(buf, b);
            }
        }
        for (w, buf) in [(&self.q_norm, &mut s.q), (&self.k_norm, &mut s.k)] {
            match w {
                Some(w) if self.whole_qk_norm => w.apply_inplace(p.pool, buf),
                Some(w) => w.apply_heads(p.pool, buf, c.dim_k),
                None => {}
            }
        }
        if let Some(ones) = &self.v_norm {
            let eps = c.norm_eps;
            p.pool.for_rows(&mut s.v, c.dim_v, |_, block| {
                rms_norm_inplace(block, ones, eps, 0.0);
            });
        }
        let cs = if local { &s.cs_local } else { &s.cs };
        let (rd, roped) = (c.rope_dims, c.uses_rope(il));
        let (rope, rows_pos) = (p.rope, &p.rows_pos);
        for (g, seg) in p.segs.iter().enumerate() {
            let (a, b, rot) = (p.starts[g], p.starts[g + 1], seg.kv.rot());
            // Rows of a prefill spread over the pool; the bits do not
            // depend on how they are split.
            p.pool.for_rows(&mut s.q[a * qd..b * qd], qd, |r0, block| {
                for (t, q) in (a + r0..).zip(block.chunks_exact_mut(qd)) {
                    if roped {
                        rope.apply(q, c.dim_k, &cs[t * rd..(t + 1) * rd]);
                    }
                    if let Some((scale, floor)) = c.attn_temp {
                        let pos = rows_pos[t] as f64;
                        let m = ((pos / floor as f64).floor() + 1.0).ln() * scale as f64 + 1.0;
                        let m = m as f32;
                        q.iter_mut().for_each(|x| *x *= m);
                    }
                    hadamard::rotate(q, rot.k);
                }
            });
            if shared {
                continue;
            }
            p.pool.for_rows(&mut s.k[a * kd..b * kd], kd, |r0, block| {
                for (t, k) in (a + r0..).zip(block.chunks_exact_mut(kd)) {
                    if roped {
                        rope.apply(k, c.dim_k, &cs[t * rd..(t + 1) * rd]);
                    }
                    hadamard::rotate(k, rot.k);
                }
            });
        }
        // A hybrid's cache holds only its attention layers.
        let kl = c.kv_index(il);
        for (g, seg) in p.segs.iter_mut().enumerate().filter(|_| !shared) {
            let rot = seg.kv.rot();
            for t in p.starts[g]..p.starts[g + 1] {
                hadamard::rotate(&mut s.v[t * vd..(t + 1) * vd], rot.v);
                seg.kv.store(
                    kl,
                    p.rows_pos[t],
                    &s.k[t * kd..(t + 1) * kd],
                    &s.v[t * vd..(t + 1) * vd],
                );
            }
        }
        let params = AttnParams {
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            dim_k: c.dim_k,
            dim_v: c.dim_v,
            scale: c.attn_scale,
            window: if local { c.sliding_window } else { None },
            softcap: c.attn_softcap,
            causal: c.causal,
            sinks: self.sinks.as_deref(),
        };
        fit(&mut s.att, n * od);
        attend(p, s, kl, &params);
        for (g, seg) in p.segs.iter().enumerate() {
            let (a, b) = (p.starts[g], p.starts[g + 1]);
            hadamard::rotate(&mut s.att[a * od..b * od], seg.kv.rot().v);
        }
        matmul(
            p.pool,
            self.wo.view(f),
            &s.att,
            n,
            fit(&mut s.o, n * c.n_embd),
            &mut s.acts,
        );
        lora::apply(p, &self.wo, &s.att, &mut s.o);
        if let Some(b) = &self.bo {
            add_bias(&mut s.o, b);
        }
    }
}

/// Multi-token segments (prefill) attend as blocks; every single-token row
/// (decode, and rows attended one by one) goes into one batched decode,
/// two pool dispatches for the layer instead of two per row. `il` is the
/// cache's layer. Queries are in `s.q`, the output goes to `s.att`, both
/// as wide as `p.cfg`'s heads say (MLA's block sets them so).
pub(crate) fn attend(p: &Pass<'_, '_, '_>, s: &mut Scratch, il: usize, params: &AttnParams) {
    let od = p.cfg.n_head * p.cfg.dim_v;
    let qd = p.cfg.n_head * p.cfg.dim_k;
    let one_by_one = |seg: &Segment<'_>, a: usize, b: usize| b - a == 1 || seg.decode_rows;
    for (g, seg) in p.segs.iter().enumerate() {
        let (a, b) = (p.starts[g], p.starts[g + 1]);
        if !one_by_one(seg, a, b) {
            attention(
                p.pool,
                p.vk,
                seg.kv,
                il,
                &s.q[a * qd..b * qd],
                seg.pos0,
                b - a,
                params,
                &mut s.att[a * od..b * od],
            );
        }
    }
    let mut outs: Vec<Option<&mut [f32]>> = s.att.chunks_exact_mut(od).map(Some).collect();
    let mut rows = Vec::new();
    for (g, seg) in p.segs.iter().enumerate() {
        let (a, b) = (p.starts[g], p.starts[g + 1]);
        if one_by_one(seg, a, b) {
            for (t, out) in outs.iter_mut().enumerate().take(b).skip(a) {
                if let Some(out) = out.take() {
                    rows.push(DecodeRow {
                        cache: &*seg.kv,
                        q: &s.q[t * qd..(t + 1) * qd],
                        pos: p.rows_pos[t],
                        out,
                    });
                }
            }
        }
    }
    if !rows.is_empty() {
        decode_many(p.pool, p.vk, il, params, &mut rows);
    }
}
