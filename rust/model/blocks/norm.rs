//! A layer's normalization, RMSNorm or LayerNorm, with its weights.

use crate::model::config::NormKind;
use crate::model::weights::Tensors;
use crate::ops::norm::{layer_norm, layer_norm_inplace, rms_norm, rms_norm_inplace};
use crate::threadpool::ThreadPool;
use crate::Result;

pub enum Norm {
    Rms {
        w: Vec<f32>,
        eps: f32,
    },
    Layer {
        w: Vec<f32>,
        b: Option<Vec<f32>>,
        eps: f32,
    },
}

impl Norm {
    /// `blk.{il}.{name}.weight` (and `.bias` for a LayerNorm that has one).
    pub fn load(t: &Tensors<'_>, name: &str, len: usize, kind: NormKind, eps: f32) -> Result<Self> {
        let w = t.vector(name, len)?;
        Ok(match kind {
            NormKind::Rms => Norm::Rms { w, eps },
            NormKind::Layer => Norm::Layer {
                w,
                b: t.opt_bias(name, len)?,
                eps,
            },
        })
    }

    /// The same from whole tensor names (the output norm).
    pub fn from_vectors(kind: NormKind, w: Vec<f32>, b: Option<Vec<f32>>, eps: f32) -> Self {
        match kind {
            NormKind::Rms => Norm::Rms { w, eps },
            NormKind::Layer => Norm::Layer { w, b, eps },
        }
    }

    fn len(&self) -> usize {
        match self {
            Norm::Rms { w, .. } | Norm::Layer { w, .. } => w.len(),
        }
    }

    /// Normalizes each row of `x` (as long as the weight) into `out`, rows
    /// spread over `pool` when there are many.
    pub fn apply(&self, pool: &ThreadPool, x: &[f32], out: &mut [f32]) {
        let dim = self.len();
        pool.for_rows(out, dim, |r0, block| {
            let x = &x[r0 * dim..r0 * dim + block.len()];
            self.apply_serial(x, block);
        });
    }

    fn apply_serial(&self, x: &[f32], out: &mut [f32]) {
        match self {
            Norm::Rms { w, eps } => rms_norm(x, w, *eps, 0.0, out),
            Norm::Layer { w, b, eps } => layer_norm(x, w, b.as_deref(), *eps, out),
        }
    }

    /// Per-head norm of rows of `head_dim`: one weight shared by every
    /// head, or (Command-R) one weight per head, laid out head after head.
    pub fn apply_heads(&self, pool: &ThreadPool, x: &mut [f32], head_dim: usize) {
        let w_len = self.len();
        if w_len == head_dim {
            return self.apply_inplace(pool, x);
        }
        pool.for_rows(x, w_len, |_, block| self.heads_serial(block, head_dim));
    }

    fn heads_serial(&self, x: &mut [f32], head_dim: usize) {
        for row in x.chunks_exact_mut(self.len()) {
            for (h, head) in row.chunks_exact_mut(head_dim).enumerate() {
                let r = h * head_dim..(h + 1) * head_dim;
                match self {
                    Norm::Rms { w, eps } => rms_norm_inplace(head, &w[r], *eps, 0.0),
                    Norm::Layer { w, b, eps } => {
                        layer_norm_inplace(head, &w[r.clone()], b.as_deref().map(|b| &b[r]), *eps)
                    }
                }
            }
        }
    }

    /// Normalizes each row of `x` in place, rows spread over `pool` when
    /// there are many.
    pub fn apply_inplace(&self, pool: &ThreadPool, x: &mut [f32]) {
        pool.for_rows(x, self.len(), |_, block| self.inplace_serial(block));
    }

    /// The same on this thread (an encoder's embedding norm, before a pass).
    pub fn inplace_serial(&self, x: &mut [f32]) {
        match self {
            Norm::Rms { w, eps } => rms_norm_inplace(x, w, *eps, 0.0),
            Norm::Layer { w, b, eps } => layer_norm_inplace(x, w, b.as_deref(), *eps),
        }
    }
}
