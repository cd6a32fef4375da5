//! The Gemma family: embeddings scaled by sqrt(n_embd), GeGLU, NeoX RoPE.
//! Gemma 2 adds post-attention and post-FFN norms, attention and final
//! logit softcapping and alternating sliding-window layers; Gemma 3 adds
//! per-head q/k norms and a separate rope base for its local layers.
//! (Converters store Gemma's `1 + w` norm weights already offset.)

use crate::gguf::GgufFile;
use crate::model::blocks::ffn::Activation;
use crate::model::blocks::{residual_add, AttnOpts, AttnWeights, FfnWeights, Norm};
use crate::model::config::{Meta, ModelConfig, NormKind};
use crate::model::family::{Arch, Loaded};
use crate::model::pass::{fit, Pass, Scratch};
use crate::model::weights::Tensors;
use crate::ops::rope::RopeOrder;
use crate::Result;

pub struct Gemma {
    layers: Vec<Layer>,
}

struct Layer {
    attn_norm: Norm,
    attn: AttnWeights,
    post_attn_norm: Option<Norm>,
    ffn_norm: Norm,
    ffn: FfnWeights,
    post_ffn_norm: Option<Norm>,
}

struct Variant {
    post_norms: bool,
    qk_norm: bool,
}

fn common(cfg: &mut ModelConfig) {
    cfg.rope_order = RopeOrder::Neox;
    cfg.embed_mul = Some((cfg.n_embd as f32).sqrt());
}

/// Gemma 2 and 3 scale queries by 1/sqrt(n_embd / n_head) in their 27B
/// size and by 1/sqrt(head size) otherwise; llama.cpp tells the size by
/// its layer count.
fn attention_scale(cfg: &mut ModelConfig, layers_27b: usize) {
    if cfg.n_layer == layers_27b {
        cfg.attn_scale = 1.0 / ((cfg.n_embd / cfg.n_head) as f32).sqrt();
    }
}

fn load(f: &GgufFile, cfg: &ModelConfig, v: Variant) -> Result<Loaded> {
    let (e, ff, eps) = (cfg.n_embd, cfg.n_ff, cfg.norm_eps);
    let opts = AttnOpts {
        qk_norm: v.qk_norm.then_some(NormKind::Rms),
        ..AttnOpts::default()
    };
    let layers = (0..cfg.n_layer)
        .map(|il| {
            let t = Tensors { f, il };
            let post = |name: &str| -> Result<Option<Norm>> {
                if v.post_norms {
                    Norm::load(&t, name, e, NormKind::Rms, eps).map(Some)
                } else {
                    Ok(None)
                }
            };
            Ok(Layer {
                attn_norm: Norm::load(&t, "attn_norm", e, NormKind::Rms, eps)?,
                attn: AttnWeights::load(&t, cfg, opts)?,
                post_attn_norm: post("post_attention_norm")?,
                ffn_norm: Norm::load(&t, "ffn_norm", e, NormKind::Rms, eps)?,
                ffn: FfnWeights::gated(&t, e, ff, Activation::GeluTanh)?,
                post_ffn_norm: post("post_ffw_norm")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Loaded::plain(Gemma { layers }))
}

pub fn load_gemma(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    common(cfg);
    let v = Variant {
        post_norms: false,
        qk_norm: false,
    };
    load(f, cfg, v)
}

pub fn load_gemma2(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    common(cfg);
    let m = Meta { f, arch: "gemma2" };
    cfg.read_sliding_window(&m, Some(4096), 2)?;
    cfg.rope_base_local = m.opt_f("rope.freq_base_swa")?.unwrap_or(cfg.rope_base);
    cfg.attn_softcap = m.opt_pos_f("attn_logit_softcapping")?;
    cfg.final_softcap = m.opt_pos_f("final_logit_softcapping")?;
    attention_scale(cfg, 46);
    let v = Variant {
        post_norms: true,
        qk_norm: false,
    };
    load(f, cfg, v)
}

pub fn load_gemma3(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    common(cfg);
    let m = Meta { f, arch: "gemma3" };
    if m.opt_u("attention.sliding_window")?.is_some_and(|w| w > 0) {
        cfg.read_sliding_window(&m, None, 6)?;
        cfg.rope_base_local = m.opt_f("rope.freq_base_swa")?.unwrap_or(10_000.0);
    }
    cfg.final_softcap = m.opt_pos_f("final_logit_softcapping")?;
    attention_scale(cfg, 62);
    let v = Variant {
        post_norms: true,
        qk_norm: true,
    };
    load(f, cfg, v)
}

impl Arch for Gemma {
    fn layer(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        let l = &self.layers[il];
        let (n, e) = (p.n, p.cfg.n_embd);
        l.attn_norm.apply(p.pool, &s.x, fit(&mut s.h, n * e));
        l.attn.forward(p, s, il);
        if let Some(w) = &l.post_attn_norm {
            w.apply_inplace(p.pool, &mut s.o);
        }
        residual_add(p.pool, &mut s.x, &s.o, 1.0);
        l.ffn_norm.apply(p.pool, &s.x, fit(&mut s.h, n * e));
        l.ffn.forward(p, s);
        if let Some(w) = &l.post_ffn_norm {
            w.apply_inplace(p.pool, &mut s.f);
        }
        residual_add(p.pool, &mut s.x, &s.f, 1.0);
    }
}
