//! Phi-3: fused `attn_qkv`, gate and up stacked in `ffn_up`, NeoX RoPE with
//! LongRoPE factors. llama.cpp turns Phi-3's sliding window off (the
//! converters do not describe it correctly); we do as it does, so both
//! engines compute the same function.

use crate::gguf::GgufFile;
use crate::model::blocks::ffn::Activation;
use crate::model::blocks::{residual_add, AttnOpts, AttnWeights, FfnWeights, Norm};
use crate::model::config::{ModelConfig, NormKind};
use crate::model::family::{Arch, Loaded};
use crate::model::pass::{fit, Pass, Scratch};
use crate::model::weights::Tensors;
use crate::ops::rope::RopeOrder;
use crate::Result;

pub struct Phi3 {
    layers: Vec<Layer>,
}

struct Layer {
    attn_norm: Norm,
    attn: AttnWeights,
    ffn_norm: Norm,
    ffn: FfnWeights,
}

pub fn load(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    cfg.rope_order = RopeOrder::Neox;
    let (e, ff, eps) = (cfg.n_embd, cfg.n_ff, cfg.norm_eps);
    let opts = AttnOpts {
        fused_qkv: true,
        qkv_bias: true,
        out_bias: true,
        ..AttnOpts::default()
    };
    let layers = (0..cfg.n_layer)
        .map(|il| {
            let t = Tensors { f, il };
            Ok(Layer {
                attn_norm: Norm::load(&t, "attn_norm", e, NormKind::Rms, eps)?,
                attn: AttnWeights::load(&t, cfg, opts)?,
                ffn_norm: Norm::load(&t, "ffn_norm", e, NormKind::Rms, eps)?,
                ffn: FfnWeights::fused_gated(&t, e, ff, Activation::Silu)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Loaded::plain(Phi3 { layers }))
}

impl Arch for Phi3 {
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
