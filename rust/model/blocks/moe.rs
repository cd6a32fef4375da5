//! A mixture-of-experts MLP: a router scores every expert per token, the
//! top `n_used` run (each a gated MLP), and their outputs are summed
//! weighted by their routing weights, in selection order as llama.cpp sums
//! them. Qwen3-MoE takes the top experts by softmax probability and
//! renormalizes; gpt-oss takes the top router logits (plus a router bias)
//! and softmaxes over just those, with biased experts and a clamped SwiGLU;
//! LFM2-MoE scores with a sigmoid and picks the top experts by score plus a
//! per-expert selection bias, weighting them by the unbiased scores
//! renormalized; Jamba weights the top experts by their softmax
//! probabilities without renormalizing. DeepSeek-V2 may leave the chosen
//! weights unnormalized and scales them. A shared expert (Granite-4.0-H,
//! DeepSeek's `expert_shared_count` of them as one wider MLP), when
//! present, runs on every token and is added.

use super::add::add_bias;
use crate::model::pass::{fit, Pass, Scratch};
use crate::model::weights::{expert_matrices, MatRef, Tensors};
use crate::ops::activation::{swiglu, swiglu_oai};
use crate::ops::matmul::{matmul, matmul_multi};
use crate::{Error, Result};

/// How the router's logits become the chosen experts and their weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Gating {
    /// Softmax over every expert, the top `n_used`, renormalized to sum 1
    /// (Qwen3-MoE; DeepSeek-V2 renormalizes only with
    /// `expert_weights_norm`, see `MoeWeights::with_weights`).
    #[default]
    SoftmaxNorm,
    /// The top `n_used` logits, then a softmax over only those (gpt-oss).
    TopKSoftmax,
    /// Softmax over every expert, the top `n_used` weighted by their
    /// probabilities as they are (Jamba: llama.cpp's softmax gating without
    /// `norm_w`).
    Softmax,
    /// A sigmoid of every logit, the top `n_used`, renormalized to sum 1
    /// (LFM2-MoE; as above for DeepSeek).
    SigmoidNorm,
}

impl Gating {
    /// llama.cpp's `expert_gating_func` values for the families that name
    /// it; the others (the softmax of the chosen weights, sqrt-softplus)
    /// are refused naming the value.
    pub fn from_gguf(v: usize) -> Result<Self> {
        match v {
            1 => Ok(Gating::SoftmaxNorm),
            2 => Ok(Gating::SigmoidNorm),
            other => Err(Error::load(format!(
                "expert_gating_func {other} is not supported (1: softmax, 2: sigmoid)"
            ))),
        }
    }
}

/// An expert's activation between its gate/up and down projections.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum ExpertAct {
    #[default]
    Silu,
    /// gpt-oss's clamped SwiGLU: `alpha` in the sigmoid, gate capped and up
    /// clamped at `limit`, and `up + 1` as the multiplier.
    SwigluOai { alpha: f32, limit: f32 },
}

/// What a family's experts have beyond gate/up/down matrices.
#[derive(Debug, Clone, Copy, Default)]
pub struct MoeOpts {
    pub gating: Gating,
    pub act: ExpertAct,
    /// Router and per-expert gate/up/down biases are read (all required).
    pub biases: bool,
}

/// Per-expert biases: `n_expert` rows each of gate, up (`ff` long) and
/// down (`n_embd` long), and the router's (`n_expert`).
struct MoeBiases {
    router: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

pub struct MoeWeights {
    router: MatRef,
    gate: Vec<MatRef>,
    up: Vec<MatRef>,
    down: Vec<MatRef>,
    n_used: usize,
    ff: usize,
    opts: MoeOpts,
    biases: Option<MoeBiases>,
    shared: Option<SharedExpert>,
    /// Added to the scores for choosing experts only (`exp_probs_b`).
    selection_bias: Option<Vec<f32>>,
    /// Softmax or sigmoid gating: the chosen experts' weights are divided
    /// by their sum (`expert_weights_norm`; always, for the families that
    /// do not name it).
    weights_norm: bool,
    /// The chosen experts' weights are multiplied by this
    /// (`expert_weights_scale`).
    weights_scale: f32,
}

/// A SwiGLU MLP every token goes through beside its routed experts.
struct SharedExpert {
    gate: MatRef,
    up: MatRef,
    down: MatRef,
    ff: usize,
}

impl MoeWeights {
    pub fn load(
        t: &Tensors<'_>,
        e: usize,
        ff: usize,
        n_expert: usize,
        n_used: usize,
    ) -> Result<Self> {
        Self::load_with(t, e, ff, n_expert, n_used, MoeOpts::default())
    }

    pub fn load_with(
        t: &Tensors<'_>,
        e: usize,
        ff: usize,
        n_expert: usize,
        n_used: usize,
        opts: MoeOpts,
    ) -> Result<Self> {
        if n_expert == 0 || n_used == 0 || n_used > n_expert || n_expert > 4096 {
            return Err(Error::load(format!(
                "mixture of experts needs 1 <= expert_used_count <= expert_count <= 4096, \
                 got {n_used} of {n_expert}"
            )));
        }
        Ok(MoeWeights {
            router: t.matrix("ffn_gate_inp", e, n_expert)?,
            gate: expert_matrices(t.f, &t.weight_name("ffn_gate_exps"), e, ff, n_expert)?,
            up: expert_matrices(t.f, &t.weight_name("ffn_up_exps"), e, ff, n_expert)?,
            down: expert_matrices(t.f, &t.weight_name("ffn_down_exps"), ff, e, n_expert)?,
            n_used,
            ff,
            opts,
            biases: if opts.biases {
                Some(MoeBiases {
                    router: t.bias("ffn_gate_inp", n_expert)?,
                    gate: t.bias("ffn_gate_exps", n_expert * ff)?,
                    up: t.bias("ffn_up_exps", n_expert * ff)?,
                    down: t.bias("ffn_down_exps", n_expert * e)?,
                })
            } else {
                None
            },
            shared: None,
            selection_bias: None,
            weights_norm: true,
            weights_scale: 1.0,
        })
    }

    /// Adds the shared expert `ffn_{gate,up,down}_shexp` of width `ff`.
    pub fn with_shared(mut self, t: &Tensors<'_>, e: usize, ff: usize) -> Result<Self> {
        self.shared = Some(SharedExpert {
            gate: t.matrix("ffn_gate_shexp", e, ff)?,
            up: t.matrix("ffn_up_shexp", e, ff)?,
            down: t.matrix("ffn_down_shexp", ff, e)?,
            ff,
        });
        Ok(self)
    }

    /// Scores by `gating`, and chooses by scores plus the layer's
    /// `exp_probs_b` bias when `biased` (as llama.cpp's `build_moe_ffn`).
    pub fn with_routing(mut self, t: &Tensors<'_>, gating: Gating, biased: bool) -> Result<Self> {
        self.opts.gating = gating;
        if biased {
            self.selection_bias = Some(t.bias("exp_probs_b", self.gate.len())?);
        }
        Ok(self)
    }

    /// Whether the chosen experts' weights are renormalized, and their
    /// scale (DeepSeek's `expert_weights_norm` and `expert_weights_scale`;
    /// llama.cpp treats a scale of 0 as 1).
    pub fn with_weights(mut self, norm: bool, scale: f32) -> Self {
        self.weights_norm = norm;
        self.weights_scale = if scale == 0.0 { 1.0 } else { scale };
        self
    }

    /// The experts each token uses and their weights, `n x n_used`.
    fn route(&self, p: &Pass<'_, '_, '_>, s: &mut Scratch) -> (Vec<usize>, Vec<f32>) {
        let (n, ne) = (p.n, self.gate.len());
        let mut logits = vec![0f32; n * ne];
        matmul(
            p.pool,
            self.router.view(p.file),
            &s.h,
            n,
            &mut logits,
            &mut s.acts,
        );
        if let Some(b) = &self.biases {
            add_bias(&mut logits, &b.router);
        }
        let mut sel = Vec::with_capacity(n * self.n_used);
        let mut w = Vec::with_capacity(n * self.n_used);
        let mut order: Vec<usize> = Vec::with_capacity(ne);
        let mut chosen = vec![0f32; ne];
        for row in logits.chunks_exact_mut(ne) {
            if self.opts.gating == Gating::TopKSoftmax {
                order.clear();
                order.extend(0..ne);
                order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
                let top = &order[..self.n_used];
                let max = row[top[0]];
                let mut sum = 0f64;
                let first = w.len();
                for &i in top {
                    let x = (row[i] - max).exp();
                    sel.push(i);
                    w.push(x);
                    sum += x as f64;
                }
                let inv = (1.0 / sum) as f32;
                w[first..].iter_mut().for_each(|x| *x *= inv);
                continue;
            }
            if self.opts.gating == Gating::SigmoidNorm {
                row.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp()));
            } else {
                let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                let mut sum = 0f64;
                for x in row.iter_mut() {
                    *x = (*x - max).exp();
                    sum += *x as f64;
                }
                let inv = (1.0 / sum) as f32;
                row.iter_mut().for_each(|x| *x *= inv);
            }
            let by: &[f32] = match &self.selection_bias {
                Some(b) => {
                    chosen
                        .iter_mut()
                        .zip(row.iter().zip(b))
                        .for_each(|(c, (&p, &bv))| *c = p + bv);
                    &chosen
                }
                None => row,
            };
            order.clear();
            order.extend(0..ne);
            // Highest score first; ties keep the lower expert.
            order.sort_by(|&a, &b| by[b].total_cmp(&by[a]).then(a.cmp(&b)));
            let top = &order[..self.n_used];
            if self.opts.gating == Gating::Softmax {
                for &i in top {
                    sel.push(i);
                    w.push(row[i]);
                }
                continue;
            }
            let total = if self.weights_norm {
                top.iter().map(|&i| row[i]).sum::<f32>().max(6.103_515_6e-5)
            } else {
                1.0
            };
            for &i in top {
                sel.push(i);
                let x = if self.weights_norm {
                    row[i] / total
                } else {
                    row[i]
                };
                w.push(x);
            }
        }
        if self.weights_scale != 1.0 {
            w.iter_mut().for_each(|x| *x *= self.weights_scale);
        }
        (sel, w)
    }

    /// Expert `ex`'s gate/up products `g`, `u` (`m x ff`, biases not yet
    /// added) through its activation and down projection into `y` (`m x
    /// n_embd`).
    #[allow(clippy::too_many_arguments)]
    fn down_of(
        &self,
        p: &Pass<'_, '_, '_>,
        s: &mut Scratch,
        ex: usize,
        g: &mut [f32],
        u: &mut [f32],
        m: usize,
        y: &mut Vec<f32>,
    ) {
        let (e, ff) = (p.cfg.n_embd, self.ff);
        if let Some(b) = &self.biases {
            add_bias(g, &b.gate[ex * ff..(ex + 1) * ff]);
            add_bias(u, &b.up[ex * ff..(ex + 1) * ff]);
        }
        match self.opts.act {
            ExpertAct::Silu => swiglu(p.pool, g, u),
            ExpertAct::SwigluOai { alpha, limit } => swiglu_oai(g, u, alpha, limit),
        }
        matmul(
            p.pool,
            self.down[ex].view(p.file),
            g,
            m,
            fit(y, m * e),
            &mut s.acts,
        );
        if let Some(b) = &self.biases {
            add_bias(y, &b.down[ex * e..(ex + 1) * e]);
        }
    }

    /// A single token (a decode step): the gate and up products of all its
    /// experts go in one pool dispatch with the one input they share,
    /// where one per expert cost a dispatch each (eight a layer on
    /// Qwen3-30B-A3B). Each row's dot product is the same either way.
    fn one_token(
        &self,
        p: &Pass<'_, '_, '_>,
        s: &mut Scratch,
        sel: &[usize],
        w: &[f32],
        outs: &mut [f32],
        y: &mut Vec<f32>,
    ) {
        let (e, k, ff) = (p.cfg.n_embd, self.n_used, self.ff);
        let views: Vec<_> = sel[..k]
            .iter()
            .flat_map(|&ex| [self.gate[ex].view(p.file), self.up[ex].view(p.file)])
            .collect();
        let (mut g, mut u) = (vec![0f32; k * ff], vec![0f32; k * ff]);
        {
            let mut slices: Vec<&mut [f32]> = Vec::with_capacity(2 * k);
            for (gc, uc) in g.chunks_mut(ff).zip(u.chunks_mut(ff)) {
                slices.push(gc);
                slices.push(uc);
            }
            matmul_multi(p.pool, &views, &s.h[..e], 1, &mut slices, &mut s.acts);
        }
        for (j, &ex) in sel[..k].iter().enumerate() {
            let (gj, uj) = (&mut g[j * ff..(j + 1) * ff], &mut u[j * ff..(j + 1) * ff]);
            self.down_of(p, s, ex, gj, uj, 1, y);
            outs[j * e..(j + 1) * e]
                .iter_mut()
                .zip(&y[..e])
                .for_each(|(o, &v)| *o = v * w[j]);
        }
    }

    /// `s.h` (`n x n_embd`) through the routed experts into `s.f`.
    pub fn forward(&self, p: &Pass<'_, '_, '_>, s: &mut Scratch) {
        let (n, e, k, ff) = (p.n, p.cfg.n_embd, self.n_used, self.ff);
        let (sel, w) = self.route(p, s);
        // Each expert runs once over the rows routed to it.
        let mut outs = vec![0f32; n * k * e];
        let (mut x, mut g, mut u, mut y) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        if n == 1 {
            self.one_token(p, s, &sel, &w, &mut outs, &mut y);
        } else {
            for ex in 0..self.gate.len() {
                let slots: Vec<usize> = (0..n * k).filter(|&i| sel[i] == ex).collect();
                if slots.is_empty() {
                    continue;
                }
                let m = slots.len();
                x.clear();
                for &i in &slots {
                    let t = i / k;
                    x.extend_from_slice(&s.h[t * e..(t + 1) * e]);
                }
                fit(&mut g, m * ff);
                fit(&mut u, m * ff);
                matmul_multi(
                    p.pool,
                    &[self.gate[ex].view(p.file), self.up[ex].view(p.file)],
                    &x,
                    m,
                    &mut [&mut g[..], &mut u[..]],
                    &mut s.acts,
                );
                self.down_of(p, s, ex, &mut g, &mut u, m, &mut y);
                for (r, &i) in slots.iter().enumerate() {
                    let wi = w[i];
                    outs[i * e..(i + 1) * e]
                        .iter_mut()
                        .zip(&y[r * e..(r + 1) * e])
                        .for_each(|(o, &v)| *o = v * wi);
                }
            }
        }
        let f = fit(&mut s.f, n * e);
        for t in 0..n {
            let dst = &mut f[t * e..(t + 1) * e];
            dst.copy_from_slice(&outs[t * k * e..(t * k + 1) * e]);
            for j in 1..k {
                let src = &outs[(t * k + j) * e..(t * k + j + 1) * e];
                dst.iter_mut().zip(src).for_each(|(a, &b)| *a += b);
            }
        }
        if let Some(sh) = &self.shared {
            fit(&mut g, n * sh.ff);
            fit(&mut u, n * sh.ff);
            matmul_multi(
                p.pool,
                &[sh.gate.view(p.file), sh.up.view(p.file)],
                &s.h,
                n,
                &mut [&mut g[..], &mut u[..]],
                &mut s.acts,
            );
            swiglu(p.pool, &mut g, &u);
            matmul(
                p.pool,
                sh.down.view(p.file),
                &g,
                n,
                fit(&mut y, n * e),
                &mut s.acts,
            );
            s.f.iter_mut().zip(&y).for_each(|(a, &b)| *a += b);
        }
    }
}
