//! BERT (sentence encoders such as all-MiniLM-L6-v2): learned absolute
//! position embeddings and a token-type row added to the token embedding,
//! a LayerNorm over the sum, then post-norm layers (attention with biases,
//! add, LayerNorm; GELU MLP with biases, add, LayerNorm). Attention is
//! bidirectional unless `bert.attention.causal` says otherwise, so the
//! model embeds and cannot generate. There is no output norm.

use crate::gguf::GgufFile;
use crate::model::blocks::{residual_add, AttnOpts, AttnWeights, FfnWeights, Norm};
use crate::model::config::{Meta, ModelConfig, NormKind};
use crate::model::family::{Arch, EncoderInput, Loaded};
use crate::model::pass::{Pass, Scratch};
use crate::model::weights::{matrix, opt_vector, vector, Tensors};
use crate::quant::dequantize_row;
use crate::{Error, Result};

pub struct Bert {
    layers: Vec<Layer>,
}

struct Layer {
    attn: AttnWeights,
    attn_out_norm: Norm,
    ffn: FfnWeights,
    out_norm: Norm,
}

pub fn load(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    let m = Meta { f, arch: "bert" };
    cfg.causal = match m.f.get(&m.key("attention.causal")) {
        None => false,
        Some(v) => v.as_bool().ok_or_else(|| {
            Error::load(format!(
                "metadata bert.attention.causal must be a bool, got {v:?}"
            ))
        })?,
    };
    if cfg.n_head_kv != cfg.n_head {
        return Err(Error::load("bert needs head_count_kv == head_count"));
    }
    // Absolute positions: no rotary embedding.
    cfg.rope_dims = 0;
    cfg.norm = NormKind::Layer;
    let (e, ff, eps) = (cfg.n_embd, cfg.n_ff, cfg.norm_eps);
    let position = matrix(f, "position_embd.weight", e, None)?;
    cfg.n_ctx_train = cfg.n_ctx_train.min(position.rows);
    let types = matrix(f, "token_types.weight", e, None)?;
    if types.rows == 0 || position.rows == 0 {
        return Err(Error::load(
            "bert needs at least one row in token_types and position_embd",
        ));
    }
    let mut type0 = vec![0f32; e];
    dequantize_row(types.ty, types.view(f).row(0), &mut type0)?;
    let input = EncoderInput::new(
        position,
        type0,
        Norm::from_vectors(
            NormKind::Layer,
            vector(f, "token_embd_norm.weight", e)?,
            opt_vector(f, "token_embd_norm.bias", e)?,
            eps,
        ),
    );
    let opts = AttnOpts {
        qkv_bias: true,
        out_bias: true,
        ..AttnOpts::default()
    };
    let layers = (0..cfg.n_layer)
        .map(|il| {
            let t = Tensors { f, il };
            Ok(Layer {
                attn: AttnWeights::load(&t, cfg, opts)?,
                attn_out_norm: Norm::load(&t, "attn_output_norm", e, NormKind::Layer, eps)?,
                ffn: FfnWeights::plain(&t, e, ff)?,
                out_norm: Norm::load(&t, "layer_output_norm", e, NormKind::Layer, eps)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Loaded {
        arch: Box::new(Bert { layers }),
        tied_output: true,
        encoder: Some(input),
        output_norm: "output_norm",
    })
}

impl Arch for Bert {
    fn layer(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        let l = &self.layers[il];
        s.h.clone_from(&s.x);
        l.attn.forward(p, s, il);
        residual_add(p.pool, &mut s.x, &s.o, 1.0);
        l.attn_out_norm.apply_inplace(p.pool, &mut s.x);
        s.h.clone_from(&s.x);
        l.ffn.forward(p, s);
        residual_add(p.pool, &mut s.x, &s.f, 1.0);
        l.out_norm.apply_inplace(p.pool, &mut s.x);
    }
}
