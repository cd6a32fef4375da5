//! Command-R: LayerNorm without bias, attention and the SwiGLU MLP in
//! parallel from one norm, optional per-head LayerNorms of q and k (one
//! weight per head), a logit multiplier, and the output head tied to the
//! token embedding.

use crate::gguf::GgufFile;
use crate::model::blocks::ffn::Activation;
use crate::model::blocks::{residual_add, AttnOpts, AttnWeights, FfnWeights, Norm};
use crate::model::config::{Meta, ModelConfig, NormKind};
use crate::model::family::{Arch, Loaded};
use crate::model::pass::{fit, Pass, Scratch};
use crate::model::weights::Tensors;
use crate::Result;

pub struct CommandR {
    layers: Vec<Layer>,
}

struct Layer {
    attn_norm: Norm,
    attn: AttnWeights,
    ffn: FfnWeights,
}

pub fn load(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    let m = Meta {
        f,
        arch: "command-r",
    };
    cfg.norm = NormKind::Layer;
    if let Some(s) = m.opt_pos_f("logit_scale")? {
        cfg.logit_mul = s;
    }
    let (e, ff, eps) = (cfg.n_embd, cfg.n_ff, cfg.norm_eps);
    let opts = AttnOpts {
        qk_norm: Some(NormKind::Layer),
        qk_norm_optional: true,
        ..AttnOpts::default()
    };
    let layers = (0..cfg.n_layer)
        .map(|il| {
            let t = Tensors { f, il };
            Ok(Layer {
                attn_norm: Norm::load(&t, "attn_norm", e, NormKind::Layer, eps)?,
                attn: AttnWeights::load(&t, cfg, opts)?,
                ffn: FfnWeights::gated(&t, e, ff, Activation::Silu)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Loaded {
        tied_output: true,
        ..Loaded::plain(CommandR { layers })
    })
}

impl Arch for CommandR {
    fn layer(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        let l = &self.layers[il];
        let (n, e) = (p.n, p.cfg.n_embd);
        l.attn_norm.apply(p.pool, &s.x, fit(&mut s.h, n * e));
        l.attn.forward(p, s, il);
        l.ffn.forward(p, s);
        // llama.cpp sums (ffn + residual) + attention; the same order keeps
        // the rounding alike.
        residual_add(p.pool, &mut s.x, &s.f, 1.0);
        residual_add(p.pool, &mut s.x, &s.o, 1.0);
    }
}
