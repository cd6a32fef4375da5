//! Mamba-2: no attention. Each layer is an RMS pre-norm and the Mamba-2
//! mixer (`blocks::ssm`), added to the residual stream. The per-sequence
//! state lives in the segment's `RecurrentState`.

use crate::gguf::GgufFile;
use crate::model::blocks::ssm::{ssm_config, SsmMixer};
use crate::model::blocks::{residual_add, Norm};
use crate::model::config::{Meta, ModelConfig, NormKind};
use crate::model::family::{Arch, Loaded};
use crate::model::pass::{fit, Pass, Scratch};
use crate::model::weights::Tensors;
use crate::Result;

pub struct Mamba2 {
    layers: Vec<Layer>,
}

struct Layer {
    norm: Norm,
    mixer: SsmMixer,
}

pub fn load(f: &GgufFile, cfg: &mut ModelConfig) -> Result<Loaded> {
    let m = Meta { f, arch: "mamba2" };
    let c = ssm_config(&m)?;
    cfg.ssm = Some(c);
    cfg.recr_layers = vec![true; cfg.n_layer];
    let (e, eps) = (cfg.n_embd, cfg.norm_eps);
    let layers = (0..cfg.n_layer)
        .map(|il| {
            let t = Tensors { f, il };
            Ok(Layer {
                norm: Norm::load(&t, "attn_norm", e, NormKind::Rms, eps)?,
                mixer: SsmMixer::load(&t, &c, e)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Loaded::plain(Mamba2 { layers }))
}

impl Arch for Mamba2 {
    fn layer(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        let l = &self.layers[il];
        let (n, e) = (p.n, p.cfg.n_embd);
        l.norm.apply(p.pool, &s.x, fit(&mut s.h, n * e));
        l.mixer.forward(p, s, il);
        residual_add(p.pool, &mut s.x, &s.o, 1.0);
    }
}
