//! OLMo 2: no pre-norms; q and k are RMS-normalized over each token's
//! whole projection; the attention and MLP outputs are normalized before
//! their residual adds. OLMo 3's sliding-window layers (when the file
//! has `attention.sliding_window`) use the plain rope.

use crate::gguf::GgufFile;
use crate::model::blocks::ffn::Activation;
use crate::model::blocks::{residual_add, AttnOpts, AttnWeights, FfnWeights, Norm};
use crate::model::config::{Meta, ModelConfig, NormKind};
use crate::model::family::{Arch, Loaded};
use crate::model::pass::{Pass, Scratch};
use crate::model::weights::Tensors;
use crate::ops::rope::RopeOrder;
use crate::Result;

pub struct Olmo2 {
    layers: Vec<Layer>,
}

struct Layer {
    attn: AttnWeights,
    post_attn_norm: Norm,
    ffn: FfnWeights,
    post_ffn_norm: Norm,
}

pub fn load(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    let m = Meta { f, arch: "olmo2" };
    cfg.rope_order = RopeOrder::Neox;
    if m.opt_u("attention.sliding_window")?.is_some_and(|w| w > 0) {
        cfg.read_sliding_window(&m, None, 4)?;
        cfg.rope_base_local = m.opt_f("rope.freq_base_swa")?.unwrap_or(cfg.rope_base);
    }
    let (e, ff, eps) = (cfg.n_embd, cfg.n_ff, cfg.norm_eps);
    let opts = AttnOpts {
        qk_norm: Some(NormKind::Rms),
        qk_norm_whole: true,
        ..AttnOpts::default()
    };
    let layers = (0..cfg.n_layer)
        .map(|il| {
            let t = Tensors { f, il };
            Ok(Layer {
                attn: AttnWeights::load(&t, cfg, opts)?,
                post_attn_norm: Norm::load(&t, "post_attention_norm", e, NormKind::Rms, eps)?,
                ffn: FfnWeights::gated(&t, e, ff, Activation::Silu)?,
                post_ffn_norm: Norm::load(&t, "post_ffw_norm", e, NormKind::Rms, eps)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Loaded::plain(Olmo2 { layers }))
}

impl Arch for Olmo2 {
    fn layer(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        let l = &self.layers[il];
        s.h.clone_from(&s.x);
        l.attn.forward(p, s, il);
        l.post_attn_norm.apply_inplace(p.pool, &mut s.o);
        residual_add(p.pool, &mut s.x, &s.o, 1.0);
        s.h.clone_from(&s.x);
        l.ffn.forward(p, s);
        l.post_ffn_norm.apply_inplace(p.pool, &mut s.f);
        residual_add(p.pool, &mut s.x, &s.f, 1.0);
    }
}
