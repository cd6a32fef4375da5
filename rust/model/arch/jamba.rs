//! Jamba: Mamba-1 layers and attention layers, which is which from the
//! per-layer `attention.head_count_kv` (0: Mamba-1), as llama.cpp reads
//! them. The attention layers have no positional encoding at all (no RoPE:
//! the Mamba layers carry order), and take q/k/v biases or a fused `attn_qkv`
//! when the file has them. Each layer's MLP is routed experts where the
//! layer has a router (`ffn_gate_inp`; softmax scores, the top experts
//! weighted by their probabilities, not renormalized) and a SwiGLU MLP
//! otherwise, both `feed_forward_length` wide.

use crate::gguf::GgufFile;
use crate::model::blocks::ffn::{Activation, Ffn};
use crate::model::blocks::mamba1::{mamba1_config, Mamba1Mixer};
use crate::model::blocks::moe::{Gating, MoeOpts, MoeWeights};
use crate::model::blocks::{residual_add, AttnOpts, AttnWeights, FfnWeights, Norm};
use crate::model::config::{Meta, ModelConfig, NormKind};
use crate::model::family::{Arch, Loaded};
use crate::model::pass::{fit, Pass, Scratch};
use crate::model::weights::Tensors;
use crate::{Error, Result};

pub struct Jamba {
    layers: Vec<Layer>,
}

enum Mixer {
    Mamba(Box<Mamba1Mixer>),
    Attn(Box<AttnWeights>),
}

struct Layer {
    norm: Norm,
    mixer: Mixer,
    ffn_norm: Norm,
    ffn: FfnWeights,
}

/// Layer `t.il`'s MLP: experts where the layer has a router, as llama.cpp
/// decides it, a SwiGLU MLP otherwise.
fn ffn(t: &Tensors<'_>, cfg: &ModelConfig, m: &Meta<'_>) -> Result<FfnWeights> {
    let (e, ff) = (cfg.n_embd, cfg.n_ff);
    if !t.has("ffn_gate_inp") {
        return FfnWeights::gated(t, e, ff, Activation::Silu);
    }
    let n_expert = m.opt_u("expert_count")?.unwrap_or(0);
    if n_expert == 0 {
        return Err(Error::load(format!(
            "tensor {} routes to experts, but metadata {} is missing or 0",
            t.weight_name("ffn_gate_inp"),
            m.key("expert_count")
        )));
    }
    let opts = MoeOpts {
        gating: Gating::Softmax,
        ..MoeOpts::default()
    };
    let moe = MoeWeights::load_with(t, e, ff, n_expert, m.u("expert_used_count")?, opts)?;
    Ok(FfnWeights(Ffn::Moe(Box::new(moe))))
}

pub fn load(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    let m = Meta { f, arch: "jamba" };
    let (c, dt_rank) = mamba1_config(&m)?;
    cfg.ssm = Some(c);
    if cfg.recr_layers.len() != cfg.n_layer {
        // One head count for every layer: no Mamba layer at all.
        cfg.recr_layers = vec![false; cfg.n_layer];
    }
    // llama.cpp's Jamba graph never rotates q and k.
    cfg.rope_dims = 0;
    let opts = AttnOpts {
        qkv_bias: true,
        fused_qkv: true,
        ..AttnOpts::default()
    };
    let (e, eps) = (cfg.n_embd, cfg.norm_eps);
    let layers = (0..cfg.n_layer)
        .map(|il| {
            let t = Tensors { f, il };
            let mixer = if cfg.is_recr_layer(il) {
                Mixer::Mamba(Box::new(Mamba1Mixer::load(&t, &c, dt_rank, e)?))
            } else {
                Mixer::Attn(Box::new(AttnWeights::load(&t, cfg, opts)?))
            };
            Ok(Layer {
                norm: Norm::load(&t, "attn_norm", e, NormKind::Rms, eps)?,
                mixer,
                ffn_norm: Norm::load(&t, "ffn_norm", e, NormKind::Rms, eps)?,
                ffn: ffn(&t, cfg, &m)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Loaded::plain(Jamba { layers }))
}

impl Arch for Jamba {
    fn layer(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        let l = &self.layers[il];
        let (n, e) = (p.n, p.cfg.n_embd);
        l.norm.apply(p.pool, &s.x, fit(&mut s.h, n * e));
        match &l.mixer {
            Mixer::Mamba(m) => m.forward(p, s, il),
            Mixer::Attn(a) => a.forward(p, s, il),
        }
        residual_add(p.pool, &mut s.x, &s.o, 1.0);
        l.ffn_norm.apply(p.pool, &s.x, fit(&mut s.h, n * e));
        l.ffn.forward(p, s);
        residual_add(p.pool, &mut s.x, &s.f, 1.0);
    }
}
