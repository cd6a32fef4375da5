//! DeepSeek-V2 (and V2-Lite, Moonlight): multi-head latent attention
//! (`blocks/mla.rs`, with or without the query's low rank) and, after
//! `leading_dense_block_count` dense SwiGLU layers, routed experts with
//! softmax or sigmoid gating, optional renormalization and scale of the
//! chosen weights, and `expert_shared_count` shared experts run as one
//! wider MLP.
//!
//! The cache holds what DeepSeek caches: per token and layer the normed
//! latent and the rotated key part, `kv_lora_rank + rope` values (the
//! converter writes these as one KV head of `key_length`, with
//! `value_length = kv_lora_rank` read from the same row).
//!
//! llama.cpp pre-scales attention for YaRN: its rope carries only
//! `rope.scaling.attn_factor` (the YaRN magnitude correction is cancelled),
//! and the scores are scaled by `mscale^2 / sqrt(key_length_mla)` with
//! `mscale = attn_factor * (1 + 0.1 * log_mul * ln(factor))`, `log_mul`
//! being the file's `rope.scaling.yarn_log_multiplier / 0.1`.

use crate::gguf::GgufFile;
use crate::model::blocks::ffn::{Activation, Ffn};
use crate::model::blocks::mla::{MlaDims, MlaWeights};
use crate::model::blocks::moe::{Gating, MoeWeights};
use crate::model::blocks::{residual_add, FfnWeights, Norm};
use crate::model::config::{per_layer_u, Meta, ModelConfig, NormKind, PerLayer, MAX_DIM};
use crate::model::family::{Arch, Loaded};
use crate::model::pass::{fit, Pass, Scratch};
use crate::model::weights::Tensors;
use crate::ops::rope::{RopeOrder, RopeScaling};
use crate::{Error, Result};

pub struct Deepseek2 {
    layers: Vec<Layer>,
}

struct Layer {
    attn_norm: Norm,
    attn: MlaWeights,
    ffn_norm: Norm,
    ffn: FfnWeights,
}

/// The routed experts' settings, the same for every MoE layer.
struct Experts {
    dense_lead: usize,
    n_expert: usize,
    n_used: usize,
    ff: Vec<usize>,
    n_shared: usize,
    gating: Gating,
    norm: bool,
    scale: f32,
}

impl Experts {
    fn read(m: &Meta<'_>, n_layer: usize) -> Result<Self> {
        let ff = match per_layer_u(m, "expert_feed_forward_length", n_layer)? {
            Some(PerLayer::One(v)) => vec![v; n_layer],
            Some(PerLayer::Each(v)) => v,
            None => {
                return Err(Error::load(format!(
                    "metadata {} is missing",
                    m.key("expert_feed_forward_length")
                )))
            }
        };
        let norm_key = m.key("expert_weights_norm");
        let norm = match m.f.get(&norm_key) {
            None => false,
            Some(v) => v.as_bool().ok_or_else(|| {
                Error::load(format!("metadata {norm_key} must be a boolean, got {v:?}"))
            })?,
        };
        if let Some(g) = m.opt_u("expert_group_count")?.filter(|&g| g > 1) {
            return Err(Error::load(format!(
                "metadata {} = {g}: grouped expert selection is not supported",
                m.key("expert_group_count")
            )));
        }
        Ok(Experts {
            dense_lead: m.opt_u("leading_dense_block_count")?.unwrap_or(0),
            n_expert: m.opt_u("expert_count")?.unwrap_or(0),
            n_used: m.opt_u("expert_used_count")?.unwrap_or(0),
            ff,
            n_shared: m.u("expert_shared_count")?,
            // llama.cpp's default for DeepSeek-V2 files that do not say.
            gating: match m.opt_u("expert_gating_func")?.unwrap_or(0) {
                0 => Gating::SoftmaxNorm,
                v => Gating::from_gguf(v)?,
            },
            norm,
            scale: m.opt_f("expert_weights_scale")?.unwrap_or(0.0),
        })
    }

    fn ffn(&self, t: &Tensors<'_>, e: usize) -> Result<FfnWeights> {
        let ff = self.ff[t.il];
        let mut moe = MoeWeights::load(t, e, ff, self.n_expert, self.n_used)?
            .with_routing(
                t,
                self.gating,
                t.f.tensor(&t.bias_name("exp_probs_b")).is_some(),
            )?
            .with_weights(self.norm, self.scale);
        if self.n_shared > 0 {
            moe = moe.with_shared(t, e, ff * self.n_shared)?;
        }
        Ok(FfnWeights(Ffn::Moe(Box::new(moe))))
    }
}

/// The MLA widths, checked against the cache shape the converter wrote.
fn mla_dims(m: &Meta<'_>, cfg: &ModelConfig) -> Result<MlaDims> {
    let (Some(k_mla), Some(v_mla)) = (
        m.opt_u("attention.key_length_mla")?,
        m.opt_u("attention.value_length_mla")?,
    ) else {
        return Err(Error::load(format!(
            "metadata {} is missing: files converted before llama.cpp's MLA layout \
             (attn_kv_b) are not supported, reconvert the model",
            m.key("attention.key_length_mla")
        )));
    };
    let dims = MlaDims {
        kv_lora: m.u("attention.kv_lora_rank")?,
        q_lora: m.opt_u("attention.q_lora_rank")?.unwrap_or(0),
        rope: cfg.rope_dims,
        nope: k_mla.saturating_sub(cfg.rope_dims),
        v: v_mla,
    };
    let out_of_range = |x: usize| x == 0 || x > 4096;
    if [dims.nope, dims.rope, dims.v, dims.kv_lora]
        .into_iter()
        .any(out_of_range)
        || dims.q_lora > MAX_DIM
    {
        return Err(Error::load(format!(
            "deepseek2 widths out of range: key_length_mla {k_mla}, rope {}, \
             value_length_mla {v_mla}, kv_lora_rank {}, q_lora_rank {}",
            dims.rope, dims.kv_lora, dims.q_lora
        )));
    }
    if cfg.n_head_kv != 1 || cfg.dim_k != dims.cache_row() || cfg.dim_v != dims.kv_lora {
        return Err(Error::load(format!(
            "deepseek2 MLA needs head_count_kv 1, key_length = kv_lora_rank + rope ({}) and \
             value_length = kv_lora_rank ({}); the file has {}, {} and {}",
            dims.cache_row(),
            dims.kv_lora,
            cfg.n_head_kv,
            cfg.dim_k,
            cfg.dim_v
        )));
    }
    Ok(dims)
}

/// llama.cpp's YaRN pre-scaling for DeepSeek-V2 (see the module comment).
fn yarn_prescale(m: &Meta<'_>, cfg: &mut ModelConfig, dims: MlaDims) -> Result<()> {
    let log_mul = m.opt_f("rope.scaling.yarn_log_multiplier")?.unwrap_or(0.0) / 0.1;
    let a = cfg.rope_attn_factor;
    let ln_f = match cfg.rope_scaling {
        RopeScaling::Yarn { factor, .. } | RopeScaling::Linear { factor } => factor.ln(),
        RopeScaling::None => 0.0,
    };
    let mscale = match &mut cfg.rope_scaling {
        RopeScaling::Yarn {
            attn_factor,
            log_mul: lm,
            ..
        } => {
            // The rope then scales by `a` alone.
            *attn_factor = a / (1.0 + 0.1 * ln_f);
            *lm = 0.0;
            a * (1.0 + 0.1 * log_mul * ln_f)
        }
        _ => a * (1.0 + 0.1 * ln_f) * (1.0 + 0.1 * log_mul * ln_f),
    };
    cfg.attn_scale = mscale * mscale / (dims.q_head() as f32).sqrt();
    Ok(())
}

pub fn load(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    let m = Meta {
        f,
        arch: "deepseek2",
    };
    if m.opt_f("attention.temperature_scale")?
        .is_some_and(|t| t != 0.0)
    {
        return Err(Error::load(format!(
            "metadata {}: attention temperature tuning is not supported for deepseek2",
            m.key("attention.temperature_scale")
        )));
    }
    if let Some(n) = m.opt_u("nextn_predict_layers")?.filter(|&n| n > 0) {
        return Err(Error::load(format!(
            "metadata {} = {n}: multi-token prediction layers are not supported",
            m.key("nextn_predict_layers")
        )));
    }
    cfg.rope_order = RopeOrder::Normal;
    let dims = mla_dims(&m, cfg)?;
    yarn_prescale(&m, cfg, dims)?;
    cfg.kv_v_in_k = true;
    cfg.kv_rope_offset = dims.kv_lora;
    let experts = Experts::read(&m, cfg.n_layer)?;
    let (e, eps) = (cfg.n_embd, cfg.norm_eps);
    let layers = (0..cfg.n_layer)
        .map(|il| {
            let t = Tensors { f, il };
            Ok(Layer {
                attn_norm: Norm::load(&t, "attn_norm", e, NormKind::Rms, eps)?,
                attn: MlaWeights::load(&t, cfg, dims)?,
                ffn_norm: Norm::load(&t, "ffn_norm", e, NormKind::Rms, eps)?,
                ffn: if il < experts.dense_lead {
                    FfnWeights::gated(&t, e, cfg.n_ff, Activation::Silu)?
                } else {
                    experts.ffn(&t, e)?
                },
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Loaded::plain(Deepseek2 { layers }))
}

impl Arch for Deepseek2 {
    fn layer(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        let l = &self.layers[il];
        let (n, e) = (p.n, p.cfg.n_embd);
        l.attn_norm.apply(p.pool, &s.x, fit(&mut s.h, n * e));
        l.attn.forward(p, s, il);
        residual_add(p.pool, &mut s.x, &s.o, 1.0);
        l.ffn_norm.apply(p.pool, &s.x, fit(&mut s.h, n * e));
        l.ffn.forward(p, s);
        residual_add(p.pool, &mut s.x, &s.f, 1.0);
    }
}
