//! gpt-oss (llama.cpp's `gpt-oss`, its `LLM_ARCH_OPENAI_MOE`): pre-norm
//! attention with q/k/v/o biases and a learned sink logit per head,
//! sliding-window and global layers alternating (even layers local by
//! default), YaRN on both kinds, NeoX rope; then the post-attention norm
//! feeds routed experts: top-k router logits (with a bias) softmaxed over
//! the chosen, biased experts, and the clamped SwiGLU.

use crate::gguf::GgufFile;
use crate::model::blocks::ffn::Ffn;
use crate::model::blocks::moe::{ExpertAct, Gating, MoeOpts, MoeWeights};
use crate::model::blocks::{residual_add, AttnOpts, AttnWeights, FfnWeights, Norm};
use crate::model::config::{Meta, ModelConfig, NormKind};
use crate::model::family::{Arch, Loaded};
use crate::model::pass::{fit, Pass, Scratch};
use crate::model::weights::Tensors;
use crate::ops::rope::RopeOrder;
use crate::{Error, Result};

/// The clamped SwiGLU's constants, fixed in llama.cpp (not in the file).
const SWIGLU_ALPHA: f32 = 1.702;
const SWIGLU_LIMIT: f32 = 7.0;

pub struct GptOss {
    layers: Vec<Layer>,
}

struct Layer {
    attn_norm: Norm,
    attn: AttnWeights,
    post_attn_norm: Norm,
    moe: FfnWeights,
}

pub fn load(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    let m = Meta { f, arch: "gpt-oss" };
    cfg.rope_order = RopeOrder::Neox;
    if cfg.rope_dims != cfg.dim_k || cfg.dim_k != cfg.dim_v {
        return Err(Error::load(format!(
            "gpt-oss rotates whole heads of one size: rope.dimension_count {}, \
             key_length {} and value_length {} must be equal",
            cfg.rope_dims, cfg.dim_k, cfg.dim_v
        )));
    }
    // llama.cpp requires the window; the pattern defaults to 2 (every even
    // layer local).
    m.u("attention.sliding_window")?;
    cfg.read_sliding_window(&m, None, 2)?;
    // Local layers keep the global rope base unless the file names one,
    // and the same scaling (YaRN in the released models).
    cfg.rope_base_local = m.opt_f("rope.freq_base_swa")?.unwrap_or(cfg.rope_base);
    cfg.rope_scaling_local = cfg.rope_scaling.clone();
    cfg.attn_scale = 1.0 / (cfg.dim_k as f32).sqrt();
    let n_expert = m.u("expert_count")?;
    let n_used = m.u("expert_used_count")?;
    let ffe = m.u("expert_feed_forward_length")?;
    let attn = AttnOpts {
        qkv_bias: true,
        out_bias: true,
        sinks: true,
        ..AttnOpts::default()
    };
    let moe = MoeOpts {
        gating: Gating::TopKSoftmax,
        act: ExpertAct::SwigluOai {
            alpha: SWIGLU_ALPHA,
            limit: SWIGLU_LIMIT,
        },
        biases: true,
    };
    let e = cfg.n_embd;
    let layers = (0..cfg.n_layer)
        .map(|il| {
            let t = Tensors { f, il };
            Ok(Layer {
                attn_norm: Norm::load(&t, "attn_norm", e, NormKind::Rms, cfg.norm_eps)?,
                attn: AttnWeights::load(&t, cfg, attn)?,
                post_attn_norm: Norm::load(
                    &t,
                    "post_attention_norm",
                    e,
                    NormKind::Rms,
                    cfg.norm_eps,
                )?,
                moe: FfnWeights(Ffn::Moe(Box::new(MoeWeights::load_with(
                    &t, e, ffe, n_expert, n_used, moe,
                )?))),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Loaded::plain(GptOss { layers }))
}

impl Arch for GptOss {
    fn layer(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        let l = &self.layers[il];
        let (n, e) = (p.n, p.cfg.n_embd);
        l.attn_norm.apply(p.pool, &s.x, fit(&mut s.h, n * e));
        l.attn.forward(p, s, il);
        residual_add(p.pool, &mut s.x, &s.o, 1.0);
        l.post_attn_norm.apply(p.pool, &s.x, fit(&mut s.h, n * e));
        l.moe.forward(p, s);
        residual_add(p.pool, &mut s.x, &s.f, 1.0);
    }
}
