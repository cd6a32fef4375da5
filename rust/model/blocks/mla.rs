//! DeepSeek's multi-head latent attention (MLA), in the absorbed form
//! llama.cpp runs for files with `attn_k_b` and `attn_v_b`.
//!
//! Each token's `attn_kv_a_mqa` row splits into the latent `c_kv`
//! (`kv_lora_rank` wide, RMS-normed) and one key part `k_pe` shared by
//! every head (RoPE's dimensions, rotated). The cache holds exactly that,
//! `[c_kv, k_pe]`, one row per token and layer; the value is the row's
//! first `kv_lora_rank` elements, read in place (`KvShape::v_in_k`).
//!
//! A head's query `[q_nope, q_pe]` (from `attn_q`, or from `attn_q_a`, its
//! norm and `attn_q_b`) meets that row as `[k_b^T q_nope, rope(q_pe)]`:
//! `k_b` (per head, `kv_lora_rank x nope`) carries the keys' decompression
//! over to the query, so attention runs as one KV head with rows of
//! `kv_lora_rank + rope` (MQA). Its output per head is a latent, which
//! `v_b` (per head) decompresses to the value width before `attn_output`.

use super::attention::attend;
use super::norm::Norm;
use crate::lora;
use crate::model::config::{ModelConfig, NormKind};
use crate::model::pass::{fit, Pass, Scratch};
use crate::model::weights::{expert_matrices, MatRef, Tensors};
use crate::ops::attention::AttnParams;
use crate::ops::matmul::matmul;
use crate::quant::GgmlType;
use crate::{Error, Result};

/// Rounds the input of a per-head product to an F16 or BF16 matrix's own
/// type, as ggml does before every such product (its `vec_dot_type`).
///
/// Why here: `k_b` and `v_b` are small per-head matrices converters often
/// leave in F16 or BF16, and their outputs are the scores' and the values'
/// latent directly; with f32 inputs instead, our logits on such a file
/// parted from llama.cpp's by several times its own batched-vs-single
/// noise (mostly through BF16's 8-bit mantissa).
fn round_to_weight_type(ty: GgmlType, x: &mut [f32]) {
    match ty {
        GgmlType::F16 => x
            .iter_mut()
            .for_each(|v| *v = half::f16::from_f32(*v).to_f32()),
        GgmlType::BF16 => x
            .iter_mut()
            .for_each(|v| *v = half::bf16::from_f32(*v).to_f32()),
        _ => {}
    }
}

/// The widths MLA's tensors and cache are made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaDims {
    /// `attention.kv_lora_rank`: the cached latent's width.
    pub kv_lora: usize,
    /// `attention.q_lora_rank`: the query's low-rank width (0: a direct
    /// `attn_q`, as DeepSeek-V2-Lite).
    pub q_lora: usize,
    /// `rope.dimension_count`: the rotated part of every query and key.
    pub rope: usize,
    /// `attention.key_length_mla - rope`: the query part that meets the
    /// latent through `k_b`.
    pub nope: usize,
    /// `attention.value_length_mla`: each head's value width.
    pub v: usize,
}

impl MlaDims {
    /// Each head's query width (`key_length_mla`).
    pub fn q_head(&self) -> usize {
        self.nope + self.rope
    }
    /// One cached row: the latent, then the rotated key part.
    pub fn cache_row(&self) -> usize {
        self.kv_lora + self.rope
    }
}

enum Query {
    Direct(MatRef),
    LowRank { a: MatRef, norm: Norm, b: MatRef },
}

pub struct MlaWeights {
    dims: MlaDims,
    q: Query,
    kv_a: MatRef,
    kv_norm: Norm,
    /// Per head: `nope` in, `kv_lora` out.
    k_b: Vec<MatRef>,
    /// Per head: `kv_lora` in, `v` out.
    v_b: Vec<MatRef>,
    wo: MatRef,
}

impl MlaWeights {
    /// The layer's tensors in llama.cpp's MLA layout. The older layout with
    /// one `attn_kv_b` (files converted before the split) is refused by
    /// name: its cache would hold full keys and values.
    pub fn load(t: &Tensors<'_>, cfg: &ModelConfig, dims: MlaDims) -> Result<Self> {
        let (e, h, eps) = (cfg.n_embd, cfg.n_head, cfg.norm_eps);
        if t.has("attn_kv_b") && !t.has("attn_k_b") {
            return Err(Error::load(format!(
                "tensor {} (the layout of files converted before llama.cpp split it into \
                 attn_k_b and attn_v_b) is not supported: reconvert the model",
                t.weight_name("attn_kv_b")
            )));
        }
        let q = if dims.q_lora > 0 {
            Query::LowRank {
                a: t.matrix("attn_q_a", e, dims.q_lora)?,
                norm: Norm::load(t, "attn_q_a_norm", dims.q_lora, NormKind::Rms, eps)?,
                b: t.matrix("attn_q_b", dims.q_lora, h * dims.q_head())?,
            }
        } else {
            Query::Direct(t.matrix("attn_q", e, h * dims.q_head())?)
        };
        Ok(MlaWeights {
            dims,
            q,
            kv_a: t.matrix("attn_kv_a_mqa", e, dims.cache_row())?,
            kv_norm: Norm::load(t, "attn_kv_a_norm", dims.kv_lora, NormKind::Rms, eps)?,
            k_b: expert_matrices(t.f, &t.weight_name("attn_k_b"), dims.nope, dims.kv_lora, h)?,
            v_b: expert_matrices(t.f, &t.weight_name("attn_v_b"), dims.kv_lora, dims.v, h)?,
            wo: t.matrix("attn_output", h * dims.v, e)?,
        })
    }

    /// `s.h` (`n x n_embd`, normalized) through attention into `s.o`.
    /// Uses `s.v` for the raw queries and `s.gate`/`s.up` for per-head
    /// operands; the feed-forward block that follows overwrites them.
    pub fn forward(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        let (c, d) = (p.cfg, self.dims);
        let (n, f, nh) = (p.n, p.file, c.n_head);
        let (qh, row, rd) = (d.q_head(), d.cache_row(), c.rope_dims);
        // Queries: n x heads x [nope, rope].
        let qraw = fit(&mut s.v, n * nh * qh);
        match &self.q {
            Query::Direct(w) => {
                matmul(p.pool, w.view(f), &s.h, n, qraw, &mut s.acts);
                lora::apply(p, w, &s.h, qraw);
            }
            Query::LowRank { a, norm, b } => {
                let qa = fit(&mut s.gate, n * d.q_lora);
                matmul(p.pool, a.view(f), &s.h, n, qa, &mut s.acts);
                lora::apply(p, a, &s.h, qa);
                let qn = fit(&mut s.up, n * d.q_lora);
                norm.apply(p.pool, qa, qn);
                matmul(p.pool, b.view(f), qn, n, qraw, &mut s.acts);
                lora::apply(p, b, qn, qraw);
            }
        }
        // The cached rows: [norm(c_kv), rope(k_pe)].
        let kv = fit(&mut s.k, n * row);
        matmul(p.pool, self.kv_a.view(f), &s.h, n, kv, &mut s.acts);
        lora::apply(p, &self.kv_a, &s.h, kv);
        let latent = fit(&mut s.gate, n * d.kv_lora);
        for (dst, src) in latent.chunks_exact_mut(d.kv_lora).zip(kv.chunks_exact(row)) {
            dst.copy_from_slice(&src[..d.kv_lora]);
        }
        let normed = fit(&mut s.up, n * d.kv_lora);
        self.kv_norm.apply(p.pool, latent, normed);
        let roped = c.uses_rope(il);
        for (t, (krow, lat)) in kv
            .chunks_exact_mut(row)
            .zip(normed.chunks_exact(d.kv_lora))
            .enumerate()
        {
            krow[..d.kv_lora].copy_from_slice(lat);
            if roped {
                let cs = &s.cs[t * rd..(t + 1) * rd];
                p.rope.apply(&mut krow[d.kv_lora..], d.rope, cs);
                let qt = &mut qraw[t * nh * qh..(t + 1) * nh * qh];
                for qhead in qt.chunks_exact_mut(qh) {
                    p.rope.apply(&mut qhead[d.nope..], d.rope, cs);
                }
            }
        }
        // Absorbed queries: n x heads x [k_b^T q_nope, rope(q_pe)].
        let qa = fit(&mut s.q, n * nh * row);
        let (nope_in, lat_out) = (&mut s.gate, &mut s.up);
        for (hd, kb) in self.k_b.iter().enumerate() {
            let x = fit(nope_in, n * d.nope);
            for (t, xr) in x.chunks_exact_mut(d.nope).enumerate() {
                let at = (t * nh + hd) * qh;
                xr.copy_from_slice(&qraw[at..at + d.nope]);
            }
            round_to_weight_type(kb.ty, x);
            let y = fit(lat_out, n * d.kv_lora);
            matmul(p.pool, kb.view(f), x, n, y, &mut s.acts);
            for (t, yr) in y.chunks_exact(d.kv_lora).enumerate() {
                let at = (t * nh + hd) * row;
                qa[at..at + d.kv_lora].copy_from_slice(yr);
                let from = (t * nh + hd) * qh + d.nope;
                qa[at + d.kv_lora..at + row].copy_from_slice(&qraw[from..from + d.rope]);
            }
        }
        let kl = c.kv_index(il);
        for (g, seg) in p.segs.iter_mut().enumerate() {
            for t in p.starts[g]..p.starts[g + 1] {
                seg.kv
                    .store(kl, p.rows_pos[t], &kv[t * row..(t + 1) * row], &[]);
            }
        }
        let params = AttnParams {
            n_head: nh,
            n_head_kv: 1,
            dim_k: row,
            dim_v: d.kv_lora,
            scale: c.attn_scale,
            window: None,
            softcap: None,
            causal: true,
            sinks: None,
        };
        fit(&mut s.att, n * nh * d.kv_lora);
        attend(p, s, kl, &params);
        // Each head's latent output through its v_b: n x heads x v.
        let mut out = vec![0f32; n * nh * d.v];
        for (hd, vb) in self.v_b.iter().enumerate() {
            let x = fit(&mut s.gate, n * d.kv_lora);
            for (t, xr) in x.chunks_exact_mut(d.kv_lora).enumerate() {
                let at = (t * nh + hd) * d.kv_lora;
                xr.copy_from_slice(&s.att[at..at + d.kv_lora]);
            }
            round_to_weight_type(vb.ty, x);
            let y = fit(&mut s.up, n * d.v);
            matmul(p.pool, vb.view(f), x, n, y, &mut s.acts);
            for (t, yr) in y.chunks_exact(d.v).enumerate() {
                let at = (t * nh + hd) * d.v;
                out[at..at + d.v].copy_from_slice(yr);
            }
        }
        let o = fit(&mut s.o, n * c.n_embd);
        matmul(p.pool, self.wo.view(f), &out, n, o, &mut s.acts);
        lora::apply(p, &self.wo, &out, o);
    }
}
