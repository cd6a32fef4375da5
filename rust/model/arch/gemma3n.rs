//! Gemma-3n, as llama.cpp 0.3.36 runs it (`src/models/gemma3n.cpp`).
//!
//! Beside Gemma 3's layer (q/k norms, post-norms, sliding-window layers
//! with their own rope base) it carries four AltUp streams: each layer
//! predicts every stream from all of them (coefficients from a router over
//! the active stream), runs attention and the FFN on the active one only,
//! then corrects every stream by the innovation. LAuReL adds a low-rank
//! branch beside attention; per-layer embeddings (a token table plus a
//! projection of the embedding) are gated into the streams after each
//! layer; the first layers sparsify their FFN gate (a Gaussian top-k); the
//! last layers reuse the KV cache of earlier ones (`cfg.kv_from_start`).
//!
//! llama.cpp fixes several of these in code rather than reading the keys
//! the converter writes; a file whose keys disagree is refused naming the
//! key, since it could not run as its metadata says.

use crate::gguf::{Array, GgufFile, Value};
use crate::lora;
use crate::model::blocks::{AttnOpts, AttnWeights, Norm};
use crate::model::config::{Meta, ModelConfig, NormKind};
use crate::model::family::{Arch, Loaded};
use crate::model::pass::{fit, Pass, Scratch};
use crate::model::weights::{expert_matrices, matrix, vector, MatRef, Tensors};
use crate::ops::activation::gelu;
use crate::ops::matmul::matmul;
use crate::ops::rope::RopeOrder;
use crate::quant::dequantize_row;
use crate::{Error, Result};

/// What llama.cpp's Gemma-3n graph hard-codes.
const N_ALTUP: usize = 4;
const ACTIVE: usize = 0;
const PER_LAYER: usize = 256;
const LAUREL_RANK: usize = 64;
const KV_FROM_START: usize = 20;
const SPARSE_LAYERS: usize = 10;
/// The standard normal's 0.95 quantile: the Gaussian top-k keeps the gate
/// values above mean + this many standard deviations.
const STD_MUL: f32 = 1.644_853_4;
const FINAL_SOFTCAP: f32 = 30.0;

pub struct Gemma3n {
    layers: Vec<Layer>,
    /// Streams 1.. from the embedding, and back before the head.
    altup_proj: Vec<MatRef>,
    altup_unembd: Vec<MatRef>,
    /// One row of `PER_LAYER x n_layer` per token.
    ple_tok: MatRef,
    ple_proj: MatRef,
    ple_norm: Norm,
}

struct Layer {
    attn_norm: Norm,
    attn: AttnWeights,
    post_attn_norm: Norm,
    ffn_norm: Norm,
    gate: MatRef,
    up: MatRef,
    down: MatRef,
    post_ffn_norm: Norm,
    sparse: bool,
    laurel_l: MatRef,
    laurel_r: MatRef,
    laurel_norm: Norm,
    router: MatRef,
    router_norm: Norm,
    /// `N_ALTUP^2 x N_ALTUP`, row-major.
    predict_coef: Vec<f32>,
    /// `N_ALTUP x N_ALTUP`, row-major.
    correct_coef: Vec<f32>,
    correct_scale: Vec<f32>,
    inp_gate: MatRef,
    proj: MatRef,
    post_norm: Norm,
}

/// An optional integer key that llama.cpp does not read: it must say what
/// llama.cpp assumes.
fn expect_u(m: &Meta<'_>, k: &str, want: usize) -> Result<()> {
    match m.opt_u(k)? {
        Some(v) if v != want => Err(Error::load(format!(
            "metadata {} = {v} is not supported: llama.cpp runs gemma3n with {want}",
            m.key(k)
        ))),
        _ => Ok(()),
    }
}

/// `activation_sparsity_scale`, one multiplier per layer (the converter
/// writes the normal quantile, -inf for a dense layer): llama.cpp applies
/// `STD_MUL` to the first `SPARSE_LAYERS` layers whatever it says.
fn check_sparsity(m: &Meta<'_>, n_layer: usize) -> Result<()> {
    let key = m.key("activation_sparsity_scale");
    let Some(v) = m.f.get(&key) else {
        return Ok(());
    };
    let Value::Array(Array::F32(scales)) = v else {
        return Err(Error::load(format!("metadata {key} must be an f32 array")));
    };
    if scales.len() != n_layer {
        return Err(Error::load(format!(
            "metadata {key} has {} values for {n_layer} layers",
            scales.len()
        )));
    }
    for (il, &s) in scales.iter().enumerate() {
        let sparse = s.is_finite() && s > 0.0;
        let agrees = if il < SPARSE_LAYERS {
            sparse && (s - STD_MUL).abs() < 1e-5
        } else {
            !sparse
        };
        if !agrees {
            return Err(Error::load(format!(
                "metadata {key}[{il}] = {s} is not supported: llama.cpp sparsifies \
                 layers 0-{} with {STD_MUL} and no others",
                SPARSE_LAYERS - 1
            )));
        }
    }
    Ok(())
}

pub fn load(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    let m = Meta { f, arch: "gemma3n" };
    let (e, ff, eps, n_layer) = (cfg.n_embd, cfg.n_ff, cfg.norm_eps, cfg.n_layer);
    if ff < 2 {
        // The Gaussian top-k takes a sample standard deviation over the gate.
        return Err(Error::load(format!(
            "metadata {} = {ff}: gemma3n needs a feed-forward width of at least 2",
            m.key("feed_forward_length")
        )));
    }
    cfg.rope_order = RopeOrder::Neox;
    cfg.embed_mul = Some((e as f32).sqrt());
    // The q/k norms stand in for the 1/sqrt(head size) scale.
    cfg.attn_scale = 1.0;
    if m.opt_u("attention.sliding_window")?.is_none() {
        return Err(Error::load(format!(
            "metadata {} is missing",
            m.key("attention.sliding_window")
        )));
    }
    cfg.read_sliding_window(&m, None, 5)?;
    cfg.rope_base_local = m.opt_f("rope.freq_base_swa")?.unwrap_or(10_000.0);
    if let Some(cap) = m.opt_f("final_logit_softcapping")? {
        if cap != FINAL_SOFTCAP {
            return Err(Error::load(format!(
                "metadata {} = {cap} is not supported: llama.cpp runs gemma3n with {FINAL_SOFTCAP}",
                m.key("final_logit_softcapping")
            )));
        }
    }
    cfg.final_softcap = Some(FINAL_SOFTCAP);
    expect_u(&m, "altup.num_inputs", N_ALTUP)?;
    expect_u(&m, "altup.active_idx", ACTIVE)?;
    expect_u(&m, "embedding_length_per_layer_input", PER_LAYER)?;
    expect_u(
        &m,
        "attention.shared_kv_layers",
        n_layer.saturating_sub(KV_FROM_START),
    )?;
    check_sparsity(&m, n_layer)?;
    if n_layer > KV_FROM_START {
        cfg.kv_from_start = Some(KV_FROM_START);
        let shared = KV_FROM_START..n_layer;
        // The sharing layers read layer 18 (sliding) or 19 (global): those
        // must be of the kinds llama.cpp assumes.
        let (swa_src, glob_src) = (KV_FROM_START - 2, KV_FROM_START - 1);
        if shared.clone().any(|il| cfg.is_local_layer(il)) && !cfg.is_local_layer(swa_src) {
            return Err(Error::load(format!(
                "gemma3n layer {swa_src} is global, but the sliding layers from \
                 {KV_FROM_START} on reuse its cache: not supported"
            )));
        }
        if shared.clone().any(|il| !cfg.is_local_layer(il)) && cfg.is_local_layer(glob_src) {
            return Err(Error::load(format!(
                "gemma3n layer {glob_src} is a sliding-window layer, but the global layers \
                 from {KV_FROM_START} on reuse its cache: not supported"
            )));
        }
    }
    let opts = AttnOpts {
        qk_norm: Some(NormKind::Rms),
        v_norm: true,
        ..AttnOpts::default()
    };
    let rms =
        |t: &Tensors<'_>, name: &str, len: usize| Norm::load(t, name, len, NormKind::Rms, eps);
    let layers = (0..n_layer)
        .map(|il| {
            let t = Tensors { f, il };
            Ok(Layer {
                attn_norm: rms(&t, "attn_norm", e)?,
                attn: AttnWeights::load(&t, cfg, opts)?,
                post_attn_norm: rms(&t, "post_attention_norm", e)?,
                ffn_norm: rms(&t, "ffn_norm", e)?,
                gate: t.matrix("ffn_gate", e, ff)?,
                up: t.matrix("ffn_up", e, ff)?,
                down: t.matrix("ffn_down", ff, e)?,
                post_ffn_norm: rms(&t, "post_ffw_norm", e)?,
                sparse: il < SPARSE_LAYERS,
                laurel_l: t.matrix("laurel_l", e, LAUREL_RANK)?,
                laurel_r: t.matrix("laurel_r", LAUREL_RANK, e)?,
                laurel_norm: rms(&t, "laurel_post_norm", e)?,
                router: t.matrix("altup_router", e, N_ALTUP)?,
                router_norm: rms(&t, "altup_router_norm", e)?,
                predict_coef: coefs(&t, "altup_predict_coef", N_ALTUP * N_ALTUP)?,
                correct_coef: coefs(&t, "altup_correct_coef", N_ALTUP)?,
                correct_scale: t.vector("altup_correct_scale", e)?,
                inp_gate: t.matrix("inp_gate", e, PER_LAYER)?,
                proj: t.matrix("proj", PER_LAYER, e)?,
                post_norm: rms(&t, "post_norm", e)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let pl = PER_LAYER * n_layer;
    Ok(Loaded::plain(Gemma3n {
        layers,
        altup_proj: expert_matrices(f, "altup_proj.weight", e, e, N_ALTUP - 1)?,
        altup_unembd: expert_matrices(f, "altup_unembd_proj.weight", e, e, N_ALTUP - 1)?,
        ple_tok: matrix(f, "per_layer_token_embd.weight", pl, Some(cfg.n_vocab))?,
        ple_proj: matrix(f, "per_layer_model_proj.weight", e, Some(pl))?,
        ple_norm: Norm::from_vectors(
            NormKind::Rms,
            vector(f, "per_layer_proj_norm.weight", PER_LAYER)?,
            None,
            eps,
        ),
    }))
}

/// A `[N_ALTUP, rows]` coefficient matrix, dequantized row-major (its
/// element count alone would let a transposed tensor through).
fn coefs(t: &Tensors<'_>, name: &str, rows: usize) -> Result<Vec<f32>> {
    let full = t.weight_name(name);
    let dims = t.f.tensor(&full).map(|x| x.dims.clone());
    if dims.as_deref() != Some(&[N_ALTUP as u64, rows as u64][..]) {
        return Err(Error::load(format!(
            "tensor {full} has shape {dims:?}, expected [{N_ALTUP}, {rows}]"
        )));
    }
    t.vector(name, N_ALTUP * rows)
}

/// ggml's `sqrt(sum_rows(sqr(x)))`: squares in f32, summed in f64.
fn magnitude(x: &[f32]) -> f32 {
    (x.iter().map(|&v| f64::from(v * v)).sum::<f64>() as f32).sqrt()
}

/// A dot product as ggml's F32 `mul_mat` takes it for rows this short:
/// f32 products summed in f64.
fn dot_short(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x * y))
        .sum::<f64>() as f32
}

/// `row * target / magnitude(row)`, in ggml's order (multiply, then divide).
fn rescale(row: &mut [f32], target: f32) {
    let mag = magnitude(row);
    row.iter_mut().for_each(|v| *v = *v * target / mag);
}

/// llama.cpp's `gaussian_topk`: `relu(x - (mean + STD_MUL * std))` per
/// row, with the sample standard deviation.
fn gaussian_topk(x: &mut [f32], width: usize) {
    for row in x.chunks_exact_mut(width) {
        let mean = (row.iter().map(|&v| f64::from(v)).sum::<f64>() as f32) / width as f32;
        let ss = row
            .iter()
            .map(|&v| {
                let d = v - mean;
                f64::from(d * d)
            })
            .sum::<f64>() as f32;
        let std = (ss * (1.0 / (width - 1) as f32)).sqrt();
        let cutoff = mean + std * STD_MUL;
        row.iter_mut().for_each(|v| *v = (*v - cutoff).max(0.0));
    }
}

impl Gemma3n {
    /// Before layer 0: the per-layer inputs (`s.per_layer`, `n x n_layer x
    /// PER_LAYER`) and the streams (`s.streams`, `N_ALTUP x n x n_embd`)
    /// from the scaled embedding in `s.x`.
    fn begin(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch) {
        let (n, e, f) = (p.n, p.cfg.n_embd, p.file);
        let pl = PER_LAYER * p.cfg.n_layer;
        let proj = fit(&mut s.per_layer, n * pl);
        matmul(p.pool, self.ple_proj.view(f), &s.x, n, proj, &mut s.acts);
        let inv_e = 1.0 / (e as f32).sqrt();
        proj.iter_mut().for_each(|v| *v *= inv_e);
        self.ple_norm.apply_inplace(p.pool, proj);
        let table = self.ple_tok.view(f);
        let tok_scale = (PER_LAYER as f32).sqrt();
        let inv_sqrt2 = 1.0 / 2f32.sqrt();
        let mut row = vec![0f32; pl];
        let tokens = p.segs.iter().flat_map(|g| g.tokens.iter());
        for (t, &tok) in tokens.enumerate() {
            // The forward pass has checked every token against the vocabulary.
            if dequantize_row(table.ty, table.row(tok as usize), &mut row).is_err() {
                row.fill(0.0);
            }
            for (v, &r) in proj[t * pl..(t + 1) * pl].iter_mut().zip(&row) {
                *v = (*v + r * tok_scale) * inv_sqrt2;
            }
        }
        let streams = fit(&mut s.streams, N_ALTUP * n * e);
        streams[..n * e].copy_from_slice(&s.x[..n * e]);
        for (i, w) in self.altup_proj.iter().enumerate() {
            let out = &mut streams[(i + 1) * n * e..(i + 2) * n * e];
            matmul(p.pool, w.view(f), &s.x, n, out, &mut s.acts);
            for (o, x) in out.chunks_exact_mut(e).zip(s.x.chunks_exact(e)) {
                rescale(o, magnitude(x));
            }
        }
    }

    /// After the last layer: the streams merged back into `s.x`.
    fn end(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch) {
        let (n, e, f) = (p.n, p.cfg.n_embd, p.file);
        let mut u = vec![0f32; n * e];
        let x = fit(&mut s.x, n * e);
        x.copy_from_slice(&s.streams[..n * e]);
        let active = &s.streams[ACTIVE * n * e..(ACTIVE + 1) * n * e];
        for (i, w) in self.altup_unembd.iter().enumerate() {
            let src = &s.streams[(i + 1) * n * e..(i + 2) * n * e];
            matmul(p.pool, w.view(f), src, n, &mut u, &mut s.acts);
            for ((ur, ar), xr) in u
                .chunks_exact_mut(e)
                .zip(active.chunks_exact(e))
                .zip(x.chunks_exact_mut(e))
            {
                rescale(ur, magnitude(ar));
                xr.iter_mut().zip(ur.iter()).for_each(|(a, b)| *a += b);
            }
        }
        let inv = 1.0 / N_ALTUP as f32;
        x.iter_mut().for_each(|v| *v *= inv);
    }

    /// The router's modalities of rows `x`: `tanh(router(norm(x) / n_embd))`,
    /// `N_ALTUP` per row.
    fn modalities(
        &self,
        p: &mut Pass<'_, '_, '_>,
        s: &mut Scratch,
        l: &Layer,
        x: &[f32],
    ) -> Vec<f32> {
        let (n, e) = (p.n, p.cfg.n_embd);
        let mut normed = vec![0f32; n * e];
        l.router_norm.apply(p.pool, x, &mut normed);
        let inv_e = 1.0 / e as f32;
        normed.iter_mut().for_each(|v| *v *= inv_e);
        let mut out = vec![0f32; n * N_ALTUP];
        matmul(
            p.pool,
            l.router.view(p.file),
            &normed,
            n,
            &mut out,
            &mut s.acts,
        );
        out.iter_mut().for_each(|v| *v = v.tanh());
        out
    }
}

impl Arch for Gemma3n {
    fn layer(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        if il == 0 {
            self.begin(p, s);
        }
        let l = &self.layers[il];
        let (n, e, f) = (p.n, p.cfg.n_embd, p.file);
        let ne = n * e;
        let a = N_ALTUP;

        // Predict every stream from all of them.
        let act: Vec<f32> = s.streams[ACTIVE * ne..(ACTIVE + 1) * ne].to_vec();
        let modal = self.modalities(p, s, l, &act);
        let mut pred = s.streams.clone();
        for t in 0..n {
            let m = &modal[t * a..(t + 1) * a];
            let coefs: Vec<f32> = l
                .predict_coef
                .chunks_exact(a)
                .map(|row| dot_short(row, m))
                .collect();
            let mut col = vec![0f32; a];
            for d in 0..e {
                for (k, c) in col.iter_mut().enumerate() {
                    *c = s.streams[k * ne + t * e + d];
                }
                for j in 0..a {
                    let v = dot_short(&coefs[j * a..(j + 1) * a], &col);
                    pred[j * ne + t * e + d] = v + col[j];
                }
            }
        }
        let active: Vec<f32> = pred[ACTIVE * ne..(ACTIVE + 1) * ne].to_vec();

        // Attention and LAuReL on the active stream.
        l.attn_norm.apply(p.pool, &active, fit(&mut s.h, ne));
        let h = s.h.clone();
        let mut low = vec![0f32; n * LAUREL_RANK];
        matmul(p.pool, l.laurel_l.view(f), &h, n, &mut low, &mut s.acts);
        let mut laurel = vec![0f32; ne];
        matmul(
            p.pool,
            l.laurel_r.view(f),
            &low,
            n,
            &mut laurel,
            &mut s.acts,
        );
        l.laurel_norm.apply_inplace(p.pool, &mut laurel);
        laurel.iter_mut().zip(&h).for_each(|(v, &x)| *v += x);
        l.attn.forward(p, s, il);
        l.post_attn_norm.apply_inplace(p.pool, &mut s.o);
        let inv_sqrt2 = 1.0 / 2f32.sqrt();
        let mut attn_laurel: Vec<f32> =
            s.o.iter()
                .zip(&active)
                .zip(&laurel)
                .map(|((&o, &x), &r)| ((o + x) + r) * inv_sqrt2)
                .collect();

        // The FFN, its gate sparsified on the first layers.
        l.ffn_norm.apply(p.pool, &attn_laurel, fit(&mut s.h, ne));
        let ff = l.gate.rows;
        let (gate, up) = (fit(&mut s.gate, n * ff), fit(&mut s.up, n * ff));
        matmul(p.pool, l.up.view(f), &s.h, n, up, &mut s.acts);
        matmul(p.pool, l.gate.view(f), &s.h, n, gate, &mut s.acts);
        lora::apply(p, &l.up, &s.h, up);
        lora::apply(p, &l.gate, &s.h, gate);
        if l.sparse {
            gaussian_topk(gate, ff);
        }
        gelu(gate);
        gate.iter_mut().zip(up.iter()).for_each(|(g, &u)| *g *= u);
        matmul(
            p.pool,
            l.down.view(f),
            &s.gate,
            n,
            fit(&mut s.f, ne),
            &mut s.acts,
        );
        lora::apply(p, &l.down, &s.gate, &mut s.f);
        l.post_ffn_norm.apply_inplace(p.pool, &mut s.f);
        attn_laurel.iter_mut().zip(&s.f).for_each(|(v, &y)| *v += y);
        let out = attn_laurel;

        // Correct every stream by the innovation.
        let modal = self.modalities(p, s, l, &out);
        for t in 0..n {
            let m = &modal[t * a..(t + 1) * a];
            for j in 0..a {
                let c = dot_short(&l.correct_coef[j * a..(j + 1) * a], m) + 1.0;
                for d in 0..e {
                    let i = t * e + d;
                    let innov = out[i] - active[i];
                    s.streams[j * ne + i] = innov * c + pred[j * ne + i];
                }
            }
        }

        // The per-layer input, gated by the corrected active stream, joins
        // the other streams.
        let mut first: Vec<f32> = s.streams[ACTIVE * ne..(ACTIVE + 1) * ne].to_vec();
        for row in first.chunks_exact_mut(e) {
            row.iter_mut()
                .zip(&l.correct_scale)
                .for_each(|(v, &w)| *v *= w);
        }
        let mut g = vec![0f32; n * PER_LAYER];
        matmul(p.pool, l.inp_gate.view(f), &first, n, &mut g, &mut s.acts);
        gelu(&mut g);
        let pl = PER_LAYER * p.cfg.n_layer;
        for (t, row) in g.chunks_exact_mut(PER_LAYER).enumerate() {
            let inp = &s.per_layer[t * pl + il * PER_LAYER..t * pl + (il + 1) * PER_LAYER];
            row.iter_mut().zip(inp).for_each(|(v, &x)| *v *= x);
        }
        matmul(p.pool, l.proj.view(f), &g, n, &mut first, &mut s.acts);
        l.post_norm.apply_inplace(p.pool, &mut first);
        for j in 1..a {
            s.streams[j * ne..(j + 1) * ne]
                .iter_mut()
                .zip(&first)
                .for_each(|(v, &y)| *v += y);
        }

        if il + 1 == p.cfg.n_layer {
            self.end(p, s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Gaussian top-k keeps only what lies above mean + 1.645 sample
    /// standard deviations, shifted down by that cutoff.
    #[test]
    fn gaussian_topk_keeps_the_upper_tail() {
        let mut x: Vec<f32> = (0..100).map(|i| i as f32).collect();
        gaussian_topk(&mut x, 100);
        let mean = 49.5f32;
        let std = ((0..100).map(|i| (i as f32 - mean).powi(2)).sum::<f32>() / 99.0).sqrt();
        let cutoff = mean + STD_MUL * std;
        for (i, v) in x.iter().enumerate() {
            let want = (i as f32 - cutoff).max(0.0);
            assert!((v - want).abs() < 1e-3, "{i}: {v} vs {want}");
        }
        assert!(x.iter().filter(|&&v| v > 0.0).count() < 10);
    }

    #[test]
    fn rescale_gives_the_target_magnitude() {
        let mut r = vec![3.0f32, 4.0];
        rescale(&mut r, 10.0);
        assert!((magnitude(&r) - 10.0).abs() < 1e-5);
        assert!((r[0] / r[1] - 0.75).abs() < 1e-6);
    }
}
