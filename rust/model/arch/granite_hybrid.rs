//! Granite-4.0-H (`granitehybrid`): Mamba-2 layers and attention layers,
//! which is which from the per-layer `attention.head_count_kv` (0: Mamba-2),
//! each followed by a SwiGLU MLP or routed experts with an optional shared
//! expert. Granite's four multipliers apply: the embedding scale, the
//! residual scale on both branches, the attention scale, and the logit
//! scale. `rope.scaling.finetuned = false` turns RoPE off (NoPE), as in
//! llama.cpp; the attention layers' q/k/v/o biases are read when present.

use crate::gguf::GgufFile;
use crate::model::blocks::ffn::{Activation, Ffn};
use crate::model::blocks::moe::MoeWeights;
use crate::model::blocks::ssm::{ssm_config, SsmMixer};
use crate::model::blocks::{residual_add, AttnOpts, AttnWeights, FfnWeights, Norm};
use crate::model::config::{Meta, ModelConfig, NormKind};
use crate::model::family::{Arch, Loaded};
use crate::model::pass::{fit, Pass, Scratch};
use crate::model::weights::Tensors;
use crate::{Error, Result};

pub struct GraniteHybrid {
    layers: Vec<Layer>,
}

enum Mixer {
    Ssm(Box<SsmMixer>),
    Attn(Box<AttnWeights>),
}

struct Layer {
    norm: Norm,
    mixer: Mixer,
    ffn_norm: Norm,
    ffn: FfnWeights,
}

/// Reads Granite's multipliers into `cfg` (0 or absent: none, as llama.cpp
/// reads them; here the logit scale is optional too).
fn multipliers(m: &Meta<'_>, cfg: &mut ModelConfig) -> Result<()> {
    cfg.embed_mul = m.opt_pos_f("embedding_scale")?;
    cfg.residual_mul = m.opt_pos_f("residual_scale")?.unwrap_or(1.0);
    if let Some(s) = m.opt_pos_f("attention.scale")? {
        cfg.attn_scale = s;
    }
    if let Some(s) = m.opt_pos_f("logit_scale")? {
        cfg.logit_mul = 1.0 / s;
    }
    Ok(())
}

/// The MLP of layer `t.il`: routed experts (with a shared expert when
/// `n_ff_shexp > 0`) in a MoE file, a SwiGLU MLP otherwise.
fn ffn(t: &Tensors<'_>, cfg: &ModelConfig, m: &Meta<'_>) -> Result<FfnWeights> {
    let (e, ff) = (cfg.n_embd, cfg.n_ff);
    let n_expert = m.opt_u("expert_count")?.unwrap_or(0);
    if n_expert == 0 {
        for name in ["ffn_gate", "ffn_up", "ffn_down"] {
            if t.f.tensor(&t.bias_name(name)).is_some() {
                return Err(Error::load(format!(
                    "granitehybrid tensor {} (an MLP bias) is not supported",
                    t.bias_name(name)
                )));
            }
        }
        return FfnWeights::gated(t, e, ff, Activation::Silu);
    }
    let moe = MoeWeights::load(t, e, ff, n_expert, m.u("expert_used_count")?)?;
    let moe = match m.opt_u("expert_shared_feed_forward_length")? {
        Some(sh) if sh > 0 => moe.with_shared(t, e, sh)?,
        _ => moe,
    };
    Ok(FfnWeights(Ffn::Moe(Box::new(moe))))
}

pub fn load(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    let m = Meta {
        f,
        arch: "granitehybrid",
    };
    let c = ssm_config(&m)?;
    cfg.ssm = Some(c);
    if cfg.recr_layers.len() != cfg.n_layer {
        // One head count for every layer: no Mamba-2 layer at all.
        cfg.recr_layers = vec![false; cfg.n_layer];
    }
    multipliers(&m, cfg)?;
    let key = m.key("rope.scaling.finetuned");
    let rope = match f.get(&key) {
        None => true,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| Error::load(format!("metadata {key} must be a bool, got {v:?}")))?,
    };
    if !rope {
        cfg.rope_dims = 0;
    }
    let opts = AttnOpts {
        qkv_bias: true,
        out_bias: true,
        fused_qkv: true,
        ..AttnOpts::default()
    };
    let (e, eps) = (cfg.n_embd, cfg.norm_eps);
    let layers = (0..cfg.n_layer)
        .map(|il| {
            let t = Tensors { f, il };
            let mixer = if cfg.is_recr_layer(il) {
                Mixer::Ssm(Box::new(SsmMixer::load(&t, &c, e)?))
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
    Ok(Loaded::plain(GraniteHybrid { layers }))
}

impl Arch for GraniteHybrid {
    fn layer(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        let l = &self.layers[il];
        let (n, e, r) = (p.n, p.cfg.n_embd, p.cfg.residual_mul);
        l.norm.apply(p.pool, &s.x, fit(&mut s.h, n * e));
        match &l.mixer {
            Mixer::Ssm(m) => m.forward(p, s, il),
            Mixer::Attn(a) => a.forward(p, s, il),
        }
        residual_add(p.pool, &mut s.x, &s.o, r);
        l.ffn_norm.apply(p.pool, &s.x, fit(&mut s.h, n * e));
        l.ffn.forward(p, s);
        residual_add(p.pool, &mut s.x, &s.f, r);
    }
}
