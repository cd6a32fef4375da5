//! The feed-forward variants: gated (SwiGLU / GeGLU) with separate or fused
//! gate and up matrices, and the plain two-matrix GELU MLP.

use super::add::add_bias;
use super::moe::MoeWeights;
use crate::lora;
use crate::model::pass::{fit, Pass, Scratch};
use crate::model::weights::{MatRef, Tensors};
use crate::ops::activation::{geglu, gelu, swiglu};
use crate::ops::matmul::{matmul, matmul_multi};
use crate::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (llama, mistral, qwen, phi3, command-r).
    Silu,
    /// GeGLU with tanh GELU (gemma).
    GeluTanh,
}

pub enum Ffn {
    /// `down(act(gate x) * up x)`.
    Gated {
        gate: MatRef,
        up: MatRef,
        down: MatRef,
        act: Activation,
    },
    /// As `Gated`, with gate and up stacked in one `ffn_up` matrix of
    /// `2 n_ff` rows, gate first (Phi-3).
    FusedGated {
        up: MatRef,
        down: MatRef,
        act: Activation,
    },
    /// Routed experts (Qwen3-MoE).
    Moe(Box<MoeWeights>),
    /// `down(gelu(up x + b) ) + b` (StarCoder2).
    Plain {
        up: MatRef,
        up_b: Option<Vec<f32>>,
        down: MatRef,
        down_b: Option<Vec<f32>>,
    },
}

pub struct FfnWeights(pub Ffn);

impl FfnWeights {
    pub fn gated(t: &Tensors<'_>, e: usize, ff: usize, act: Activation) -> Result<Self> {
        Ok(FfnWeights(Ffn::Gated {
            gate: t.matrix("ffn_gate", e, ff)?,
            up: t.matrix("ffn_up", e, ff)?,
            down: t.matrix("ffn_down", ff, e)?,
            act,
        }))
    }

    pub fn fused_gated(t: &Tensors<'_>, e: usize, ff: usize, act: Activation) -> Result<Self> {
        Ok(FfnWeights(Ffn::FusedGated {
            up: t.matrix("ffn_up", e, 2 * ff)?,
            down: t.matrix("ffn_down", ff, e)?,
            act,
        }))
    }

    pub fn plain(t: &Tensors<'_>, e: usize, ff: usize) -> Result<Self> {
        Ok(FfnWeights(Ffn::Plain {
            up: t.matrix("ffn_up", e, ff)?,
            up_b: t.opt_bias("ffn_up", ff)?,
            down: t.matrix("ffn_down", ff, e)?,
            down_b: t.opt_bias("ffn_down", e)?,
        }))
    }

    /// `s.h` (`n x n_embd`) through the MLP into `s.f`.
    pub fn forward(&self, p: &Pass<'_, '_, '_>, s: &mut Scratch) {
        let (n, e, f) = (p.n, p.cfg.n_embd, p.file);
        let ff = p.cfg.n_ff;
        let act = |gate: &mut [f32], up: &[f32], a: Activation| match a {
            Activation::Silu => swiglu(p.pool, gate, up),
            Activation::GeluTanh => geglu(gate, up),
        };
        let down = match &self.0 {
            Ffn::Moe(m) => return m.forward(p, s),
            Ffn::Gated {
                gate,
                up,
                down,
                act: a,
            } => {
                fit(&mut s.gate, n * ff);
                fit(&mut s.up, n * ff);
                matmul_multi(
                    p.pool,
                    &[gate.view(f), up.view(f)],
                    &s.h,
                    n,
                    &mut [&mut s.gate[..], &mut s.up[..]],
                    &mut s.acts,
                );
                lora::apply(p, gate, &s.h, &mut s.gate);
                lora::apply(p, up, &s.h, &mut s.up);
                act(&mut s.gate, &s.up, *a);
                down
            }
            Ffn::FusedGated { up, down, act: a } => {
                matmul(
                    p.pool,
                    up.view(f),
                    &s.h,
                    n,
                    fit(&mut s.up, n * 2 * ff),
                    &mut s.acts,
                );
                lora::apply(p, up, &s.h, &mut s.up);
                let gate = fit(&mut s.gate, n * ff);
                for (g, row) in gate.chunks_exact_mut(ff).zip(s.up.chunks_exact(2 * ff)) {
                    g.copy_from_slice(&row[..ff]);
                }
                // Compact the up halves to the front of `s.up`, row by row.
                for t in 0..n {
                    s.up.copy_within((2 * t + 1) * ff..(2 * t + 2) * ff, t * ff);
                }
                s.up.truncate(n * ff);
                act(&mut s.gate, &s.up, *a);
                down
            }
            Ffn::Plain {
                up,
                up_b,
                down,
                down_b: _,
            } => {
                matmul(
                    p.pool,
                    up.view(f),
                    &s.h,
                    n,
                    fit(&mut s.gate, n * ff),
                    &mut s.acts,
                );
                lora::apply(p, up, &s.h, &mut s.gate);
                if let Some(b) = up_b {
                    add_bias(&mut s.gate, b);
                }
                gelu(&mut s.gate);
                down
            }
        };
        matmul(
            p.pool,
            down.view(f),
            &s.gate,
            n,
            fit(&mut s.f, n * e),
            &mut s.acts,
        );
        lora::apply(p, down, &s.gate, &mut s.f);
        if let Ffn::Plain {
            down_b: Some(b), ..
        } = &self.0
        {
            add_bias(&mut s.f, b);
        }
    }
}
