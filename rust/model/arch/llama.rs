//! The llama family: llama (and Mistral files, which llama.cpp writes as
//! `llama`), Granite (four multipliers), Qwen2 (q/k/v biases) and Qwen3
//! (per-head q/k RMSNorm), Qwen3-MoE (Qwen3 with routed experts),
//! SmolLM3 (every fourth layer without RoPE). Pre-norm attention, then a
//! pre-norm SwiGLU MLP.

use crate::gguf::GgufFile;
use crate::model::blocks::ffn::{Activation, Ffn};
use crate::model::blocks::moe::MoeWeights;
use crate::model::blocks::{residual_add, AttnOpts, AttnWeights, FfnWeights, Norm};
use crate::model::config::{Meta, ModelConfig, NormKind};
use crate::model::family::{Arch, Loaded};
use crate::model::pass::{fit, Pass, Scratch};
use crate::model::weights::Tensors;
use crate::ops::rope::RopeOrder;
use crate::Result;

pub struct Llama {
    layers: Vec<Layer>,
}

struct Layer {
    attn_norm: Norm,
    attn: AttnWeights,
    ffn_norm: Norm,
    ffn: FfnWeights,
}

/// Mixture-of-experts shape: experts, experts per token, expert width.
type Experts = (usize, usize, usize);

fn load_with(
    f: &GgufFile,
    cfg: &ModelConfig,
    opts: AttnOpts,
    experts: Option<Experts>,
) -> Result<Loaded> {
    let (e, ff) = (cfg.n_embd, cfg.n_ff);
    let layers = (0..cfg.n_layer)
        .map(|il| {
            let t = Tensors { f, il };
            let ffn = match experts {
                Some((n, used, ffe)) => {
                    FfnWeights(Ffn::Moe(Box::new(MoeWeights::load(&t, e, ffe, n, used)?)))
                }
                None => FfnWeights::gated(&t, e, ff, Activation::Silu)?,
            };
            Ok(Layer {
                attn_norm: Norm::load(&t, "attn_norm", e, NormKind::Rms, cfg.norm_eps)?,
                attn: AttnWeights::load(&t, cfg, opts)?,
                ffn_norm: Norm::load(&t, "ffn_norm", e, NormKind::Rms, cfg.norm_eps)?,
                ffn,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Loaded::plain(Llama { layers }))
}

fn load(f: &GgufFile, cfg: &ModelConfig, opts: AttnOpts) -> Result<Loaded> {
    load_with(f, cfg, opts, None)
}

/// Qwen3-MoE: Qwen3's attention, routed SwiGLU experts for the MLP.
pub fn load_qwen3moe(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    let m = Meta {
        f,
        arch: "qwen3moe",
    };
    cfg.rope_order = RopeOrder::Neox;
    let n_expert = m.u("expert_count")?;
    let n_used = m.u("expert_used_count")?;
    let ffe = m.opt_u("expert_feed_forward_length")?.unwrap_or(cfg.n_ff);
    let opts = AttnOpts {
        qk_norm: Some(NormKind::Rms),
        ..AttnOpts::default()
    };
    load_with(f, cfg, opts, Some((n_expert, n_used, ffe)))
}

pub fn load_llama(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    load(f, cfg, AttnOpts::default())
}

/// Mistral 3: llama with YaRN's extra keys and, when
/// `attention.temperature_scale` is set, Llama-4 attention temperature over
/// blocks of the original context length.
pub fn load_mistral3(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    let m = Meta {
        f,
        arch: "mistral3",
    };
    cfg.read_yarn_extras(&m)?;
    if let Some(t) = m
        .opt_f("attention.temperature_scale")?
        .filter(|&t| t != 0.0)
    {
        let floor = m
            .opt_u("rope.scaling.original_context_length")?
            .unwrap_or(cfg.n_ctx_train);
        if floor == 0 {
            return Err(crate::Error::load(
                "mistral3 attention temperature needs a non-zero original context length",
            ));
        }
        cfg.attn_temp = Some((t, floor));
    }
    load(f, cfg, AttnOpts::default())
}

/// SmolLM3: llama whose every fourth layer (3, 7, ...) attends without
/// RoPE. llama.cpp fixes the interval at 4 and reads no key for it; its
/// loader takes q/k/v biases and a fused `attn_qkv` when the file has them.
pub fn load_smollm3(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    const NO_ROPE_EVERY: usize = 4;
    if cfg.rope_dims != cfg.dim_k {
        return Err(crate::Error::load(format!(
            "smollm3 rotates whole heads: rope.dimension_count {} must equal the head size {}",
            cfg.rope_dims, cfg.dim_k
        )));
    }
    cfg.nope_layers = (0..cfg.n_layer)
        .map(|il| (il + 1) % NO_ROPE_EVERY == 0)
        .collect();
    let opts = AttnOpts {
        qkv_bias: true,
        fused_qkv: true,
        ..AttnOpts::default()
    };
    load(f, cfg, opts)
}

pub fn load_granite(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    let m = Meta { f, arch: "granite" };
    // llama.cpp treats 0 (or absence) as "no multiplier" for all but the
    // logit scale, which it requires.
    cfg.embed_mul = m.opt_pos_f("embedding_scale")?;
    cfg.residual_mul = m.opt_pos_f("residual_scale")?.unwrap_or(1.0);
    if let Some(s) = m.opt_pos_f("attention.scale")? {
        cfg.attn_scale = s;
    }
    let logit_scale = m.opt_pos_f("logit_scale")?.ok_or_else(|| {
        crate::Error::load("metadata granite.logit_scale is missing or not positive")
    })?;
    cfg.logit_mul = 1.0 / logit_scale;
    load(f, cfg, AttnOpts::default())
}

pub fn load_qwen2(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    cfg.rope_order = RopeOrder::Neox;
    let opts = AttnOpts {
        qkv_bias: true,
        ..AttnOpts::default()
    };
    load(f, cfg, opts)
}

pub fn load_qwen3(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    cfg.rope_order = RopeOrder::Neox;
    let opts = AttnOpts {
        qk_norm: Some(NormKind::Rms),
        ..AttnOpts::default()
    };
    load(f, cfg, opts)
}

impl Arch for Llama {
    fn layer(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        let l = &self.layers[il];
        let (n, e, r) = (p.n, p.cfg.n_embd, p.cfg.residual_mul);
        l.attn_norm.apply(p.pool, &s.x, fit(&mut s.h, n * e));
        l.attn.forward(p, s, il);
        residual_add(p.pool, &mut s.x, &s.o, r);
        l.ffn_norm.apply(p.pool, &s.x, fit(&mut s.h, n * e));
        l.ffn.forward(p, s);
        residual_add(p.pool, &mut s.x, &s.f, r);
    }
}
