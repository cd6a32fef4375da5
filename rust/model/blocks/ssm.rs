//! The Mamba-2 mixer, shared by Mamba-2 and the hybrids built on it
//! (Granite-4.0-H): an input projection into z, xBC and dt, a causal
//! convolution over xBC, the selective state-space scan (one decay per
//! head, B and C shared by groups of heads), the skip `D x`, the gate
//! `silu(z)`, an RMSNorm per group, and the output projection. The
//! per-sequence state lives in the segment's `RecurrentState`; the rows of
//! a segment are scanned in order.

use crate::model::config::{Meta, SsmConfig, MAX_DIM};
use crate::model::pass::{fit, Pass, Scratch};
use crate::model::weights::{vector, MatRef, Tensors};
use crate::ops::matmul::matmul;
use crate::ops::norm::rms_norm_inplace;
use crate::ops::ssm::{conv_step, scan_step, ScanShape};
use crate::{Error, Result};

pub struct SsmMixer {
    ssm_in: MatRef,
    conv_w: Vec<f32>,
    conv_b: Vec<f32>,
    dt_b: Vec<f32>,
    a: Vec<f32>,
    d: Vec<f32>,
    /// `n_group x (d_inner / n_group)`: one RMSNorm weight per group.
    ssm_norm: Vec<f32>,
    ssm_out: MatRef,
}

/// The `ssm.*` metadata, checked for a consistent shape.
pub fn ssm_config(m: &Meta<'_>) -> Result<SsmConfig> {
    let c = SsmConfig {
        d_conv: m.u("ssm.conv_kernel")?,
        d_inner: m.u("ssm.inner_size")?,
        d_state: m.u("ssm.state_size")?,
        n_group: m.opt_u("ssm.group_count")?.unwrap_or(1),
        n_head: m.u("ssm.time_step_rank")?,
    };
    let dims = [c.d_conv, c.d_inner, c.d_state, c.n_group, c.n_head];
    if dims.iter().any(|&v| v == 0 || v > MAX_DIM)
        || c.d_conv > 64
        || !c.d_inner.is_multiple_of(c.n_head)
        || !c.d_inner.is_multiple_of(c.n_group)
        || !c.n_head.is_multiple_of(c.n_group)
    {
        return Err(Error::load(format!(
            "{} ssm shape is out of range or inconsistent: conv kernel {}, inner {}, \
             state {}, groups {}, heads {}",
            m.arch, c.d_conv, c.d_inner, c.d_state, c.n_group, c.n_head
        )));
    }
    Ok(c)
}

impl SsmMixer {
    /// Layer `t.il`'s mixer; the convolution bias may be absent (zero), as
    /// llama.cpp allows for Granite-4.0-H.
    pub fn load(t: &Tensors<'_>, c: &SsmConfig, n_embd: usize) -> Result<Self> {
        let il = t.il;
        let d_in_proj = 2 * c.d_inner + 2 * c.n_group * c.d_state + c.n_head;
        // A and D carry no `.weight` suffix in llama.cpp's names.
        let bare = |name: &str, len: usize| vector(t.f, &format!("blk.{il}.{name}"), len);
        Ok(SsmMixer {
            ssm_in: t.matrix("ssm_in", n_embd, d_in_proj)?,
            conv_w: t.vector("ssm_conv1d", c.conv_dim() * c.d_conv)?,
            conv_b: t
                .opt_bias("ssm_conv1d", c.conv_dim())?
                .unwrap_or_else(|| vec![0.0; c.conv_dim()]),
            dt_b: t.bias("ssm_dt", c.n_head)?,
            a: bare("ssm_a", c.n_head)?,
            d: bare("ssm_d", c.n_head)?,
            ssm_norm: t.vector("ssm_norm", c.d_inner)?,
            ssm_out: t.matrix("ssm_out", c.d_inner, n_embd)?,
        })
    }

    /// `s.h` (`n x n_embd`, normalized) through the mixer into `s.o`,
    /// advancing each segment's state of layer `il`.
    pub fn forward(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        let Some(c) = p.cfg.ssm else { return };
        let (n, e, f) = (p.n, p.cfg.n_embd, p.file);
        let (di, cd, ng, ds) = (c.d_inner, c.conv_dim(), c.n_group, c.d_state);
        let width = 2 * di + 2 * ng * ds + c.n_head;
        matmul(
            p.pool,
            self.ssm_in.view(f),
            &s.h,
            n,
            fit(&mut s.gate, n * width),
            &mut s.acts,
        );
        crate::lora::apply(p, &self.ssm_in, &s.h, &mut s.gate);
        let sh = ScanShape {
            n_head: c.n_head,
            head_dim: c.head_dim(),
            d_state: ds,
            n_group: ng,
        };
        fit(&mut s.att, n * di);
        let mut xbc = vec![0f32; cd];
        let mut dt = vec![0f32; c.n_head];
        for (g, seg) in p.segs.iter_mut().enumerate() {
            let Some(rec) = seg.rec.as_deref_mut() else {
                continue;
            };
            let Some((conv, ssm)) = rec.layer_mut(il) else {
                continue;
            };
            for t in p.starts[g]..p.starts[g + 1] {
                let row = &s.gate[t * width..(t + 1) * width];
                let (z, rest) = row.split_at(di);
                let (xbc_in, dt_in) = rest.split_at(cd);
                conv_step(conv, xbc_in, &self.conv_w, &self.conv_b, c.d_conv, &mut xbc);
                dt.iter_mut()
                    .zip(dt_in)
                    .zip(&self.dt_b)
                    .for_each(|((o, &v), &b)| *o = v + b);
                let (x, bc) = xbc.split_at(di);
                let (b, cc) = bc.split_at(ng * ds);
                let y = &mut s.att[t * di..(t + 1) * di];
                scan_step(&sh, ssm, x, &dt, &self.a, b, cc, y);
                let hd = c.head_dim();
                for (h, &dh) in self.d.iter().enumerate() {
                    for i in h * hd..(h + 1) * hd {
                        y[i] += x[i] * dh;
                    }
                }
                for (v, &zv) in y.iter_mut().zip(z) {
                    *v *= zv / (1.0 + (-zv).exp());
                }
                let gl = di / ng;
                for (grp, w) in y.chunks_exact_mut(gl).zip(self.ssm_norm.chunks_exact(gl)) {
                    rms_norm_inplace(grp, w, p.cfg.norm_eps, 0.0);
                }
            }
        }
        matmul(
            p.pool,
            self.ssm_out.view(f),
            &s.att,
            n,
            fit(&mut s.o, n * e),
            &mut s.acts,
        );
        crate::lora::apply(p, &self.ssm_out, &s.att, &mut s.o);
    }
}
