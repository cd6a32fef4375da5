//! LFM2: a hybrid of short-convolution layers and attention layers, each
//! followed by a SwiGLU MLP. Which layer is which comes from the per-layer
//! `attention.head_count_kv` (0: a convolution layer), as llama.cpp reads
//! it. A convolution layer projects the normalized input into B, C and x,
//! convolves `B * x` causally over the last `shortconv.l_cache` tokens of
//! each channel (no bias, no activation) and gates the result with C before
//! the output projection. The last `l_cache - 1` inputs of the convolution
//! are the sequence's recurrent state; attention layers keep keys and
//! values in the KV cache (which holds only them) and norm q and k per head.
//! LFM2-MoE (`lfm2moe`) is the same with routed experts (sigmoid or softmax
//! scores, a per-expert selection bias) after `leading_dense_block_count`
//! dense layers.

use crate::gguf::GgufFile;
use crate::model::blocks::ffn::{Activation, Ffn};
use crate::model::blocks::moe::{Gating, MoeWeights};
use crate::model::blocks::{residual_add, AttnOpts, AttnWeights, FfnWeights, Norm};
use crate::model::config::{per_layer_u, Meta, ModelConfig, NormKind, PerLayer, SsmConfig};
use crate::model::family::{Arch, Loaded};
use crate::model::pass::{fit, Pass, Scratch};
use crate::model::weights::{MatRef, Tensors};
use crate::ops::matmul::matmul;
use crate::ops::rope::RopeOrder;
use crate::ops::ssm::causal_conv_step;
use crate::{Error, Result};

pub struct Lfm2 {
    layers: Vec<Layer>,
}

enum Mixer {
    Conv(ShortConv),
    Attn(Box<AttnWeights>),
}

struct ShortConv {
    in_proj: MatRef,
    /// `n_embd x l_cache`, one kernel per channel, oldest tap first.
    conv: Vec<f32>,
    out_proj: MatRef,
}

struct Layer {
    norm: Norm,
    mixer: Mixer,
    ffn_norm: Norm,
    ffn: FfnWeights,
}

/// The convolution state's shape in the recurrent-state layout Mamba-2
/// uses: one "inner" channel per embedding channel and no SSM state.
fn conv_shape(l_cache: usize, n_embd: usize) -> Result<SsmConfig> {
    if !(2..=64).contains(&l_cache) {
        return Err(Error::load(format!(
            "shortconv.l_cache {l_cache} is out of range (2 to 64)"
        )));
    }
    Ok(SsmConfig {
        d_conv: l_cache,
        d_inner: n_embd,
        d_state: 0,
        n_group: 1,
        n_head: 1,
    })
}

/// LFM2-MoE's experts: from which layer on, their widths, their routing.
struct Experts {
    dense_lead: usize,
    n_expert: usize,
    n_used: usize,
    /// Expert width of each layer.
    ff: Vec<usize>,
    gating: Gating,
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
        Ok(Experts {
            dense_lead: m.opt_u("leading_dense_block_count")?.unwrap_or(0),
            n_expert: m.u("expert_count")?,
            n_used: m.u("expert_used_count")?,
            ff,
            gating: Gating::from_gguf(m.u("expert_gating_func")?)?,
        })
    }

    fn ffn(&self, t: &Tensors<'_>, e: usize) -> Result<FfnWeights> {
        let moe = MoeWeights::load(t, e, self.ff[t.il], self.n_expert, self.n_used)?.with_routing(
            t,
            self.gating,
            true,
        )?;
        Ok(FfnWeights(Ffn::Moe(Box::new(moe))))
    }
}

pub fn load(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    load_with(f, cfg, "lfm2")
}

pub fn load_lfm2moe(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    load_with(f, cfg, "lfm2moe")
}

fn load_with(f: &GgufFile, cfg: &mut ModelConfig, arch: &str) -> Result<Loaded> {
    let m = Meta { f, arch };
    let experts = match arch {
        "lfm2moe" => Some(Experts::read(&m, cfg.n_layer)?),
        _ => None,
    };
    let e = cfg.n_embd;
    let l_cache = m.u("shortconv.l_cache")?;
    if cfg.recr_layers.len() != cfg.n_layer {
        // One head count for every layer: no convolution layer at all.
        cfg.recr_layers = vec![false; cfg.n_layer];
    }
    cfg.ssm = Some(conv_shape(l_cache, e)?);
    cfg.rope_order = RopeOrder::Neox;
    if let Some(w) = m.opt_u("attention.sliding_window")?.filter(|&w| w > 0) {
        // llama.cpp: every attention layer slides when a window is set.
        cfg.sliding_window = Some(w);
        cfg.swa_layers = cfg.recr_layers.iter().map(|&r| !r).collect();
    }
    let (qd, ..) = cfg.attn_dims();
    if qd != e {
        return Err(Error::load(format!(
            "{arch} attention width {qd} (heads x head size) must equal the embedding {e}"
        )));
    }
    let opts = AttnOpts {
        qk_norm: Some(NormKind::Rms),
        ..AttnOpts::default()
    };
    let eps = cfg.norm_eps;
    let layers = (0..cfg.n_layer)
        .map(|il| {
            let t = Tensors { f, il };
            let mixer = if cfg.is_recr_layer(il) {
                Mixer::Conv(ShortConv {
                    in_proj: t.matrix("shortconv.in_proj", e, 3 * e)?,
                    conv: t.vector("shortconv.conv", e * l_cache)?,
                    out_proj: t.matrix("shortconv.out_proj", e, e)?,
                })
            } else {
                Mixer::Attn(Box::new(AttnWeights::load(&t, cfg, opts)?))
            };
            Ok(Layer {
                norm: Norm::load(&t, "attn_norm", e, NormKind::Rms, eps)?,
                mixer,
                ffn_norm: Norm::load(&t, "ffn_norm", e, NormKind::Rms, eps)?,
                ffn: match &experts {
                    Some(x) if il >= x.dense_lead => x.ffn(&t, e)?,
                    _ => FfnWeights::gated(&t, e, cfg.n_ff, Activation::Silu)?,
                },
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut loaded = Loaded::plain(Lfm2 { layers });
    // llama.cpp's name for LFM2's final norm.
    loaded.output_norm = "token_embd_norm";
    Ok(loaded)
}

impl ShortConv {
    /// `s.h` (`n x n_embd`, normalized) through the convolution into `s.o`.
    fn forward(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        let (n, e, f) = (p.n, p.cfg.n_embd, p.file);
        let d_conv = p.cfg.ssm.map_or(0, |c| c.d_conv);
        matmul(
            p.pool,
            self.in_proj.view(f),
            &s.h,
            n,
            fit(&mut s.gate, n * 3 * e),
            &mut s.acts,
        );
        crate::lora::apply(p, &self.in_proj, &s.h, &mut s.gate);
        fit(&mut s.att, n * e);
        let mut bx = vec![0f32; e];
        for (g, seg) in p.segs.iter_mut().enumerate() {
            let Some(rec) = seg.rec.as_deref_mut() else {
                continue;
            };
            let Some((conv, _)) = rec.layer_mut(il) else {
                continue;
            };
            // A segment's rows go through its state in order.
            for t in p.starts[g]..p.starts[g + 1] {
                let row = &s.gate[t * 3 * e..(t + 1) * 3 * e];
                let (b, rest) = row.split_at(e);
                let (c, x) = rest.split_at(e);
                bx.iter_mut()
                    .zip(b.iter().zip(x))
                    .for_each(|(o, (&bv, &xv))| *o = bv * xv);
                let y = &mut s.att[t * e..(t + 1) * e];
                causal_conv_step(conv, &bx, &self.conv, d_conv, y);
                y.iter_mut().zip(c).for_each(|(v, &cv)| *v *= cv);
            }
        }
        matmul(
            p.pool,
            self.out_proj.view(f),
            &s.att,
            n,
            fit(&mut s.o, n * e),
            &mut s.acts,
        );
        crate::lora::apply(p, &self.out_proj, &s.att, &mut s.o);
    }
}

impl Arch for Lfm2 {
    fn layer(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        let l = &self.layers[il];
        let (n, e) = (p.n, p.cfg.n_embd);
        l.norm.apply(p.pool, &s.x, fit(&mut s.h, n * e));
        match &l.mixer {
            Mixer::Conv(c) => c.forward(p, s, il),
            Mixer::Attn(a) => a.forward(p, s, il),
        }
        residual_add(p.pool, &mut s.x, &s.o, 1.0);
        l.ffn_norm.apply(p.pool, &s.x, fit(&mut s.h, n * e));
        l.ffn.forward(p, s);
        residual_add(p.pool, &mut s.x, &s.f, 1.0);
    }
}
