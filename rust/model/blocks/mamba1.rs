//! The Mamba-1 mixer (Jamba's recurrent layers): an input projection into
//! x and z, a causal depthwise convolution over x with a bias and SiLU, a
//! projection of the result into the step's low-rank input and B and C
//! (each RMS-normed, as Jamba does), the step's own projection up to one
//! per channel (with a bias), the selective scan with a decay per channel
//! and state, the skip `D x`, the gate `silu(z)` and the output projection.
//! The per-sequence state lives in the segment's `RecurrentState` (shaped
//! as `config::SsmConfig` describes Mamba-1); the rows of a segment are
//! convolved and scanned in order, the projections run over every row of
//! the pass at once.

use crate::model::config::{Meta, SsmConfig, MAX_DIM};
use crate::model::pass::{fit, Pass, Scratch};
use crate::model::weights::{vector, MatRef, Tensors};
use crate::ops::matmul::matmul;
use crate::ops::norm::rms_norm_inplace;
use crate::ops::ssm::{conv_step, scan_step_mamba1};
use crate::threadpool::{SharedMut, ThreadPool};
use crate::{Error, Result};
use std::ops::Range;

pub struct Mamba1Mixer {
    /// `n_embd` to `2 d_inner`: x, then z.
    ssm_in: MatRef,
    /// `d_inner x d_conv`, oldest tap first.
    conv_w: Vec<f32>,
    conv_b: Vec<f32>,
    /// `d_inner` to `dt_rank + 2 d_state`: the step's input, B, C.
    ssm_x: MatRef,
    dt_norm: Vec<f32>,
    b_norm: Vec<f32>,
    c_norm: Vec<f32>,
    /// `dt_rank` to `d_inner`.
    ssm_dt: MatRef,
    dt_b: Vec<f32>,
    /// `d_inner x d_state`: `-exp(A_log)`, as the converter stores it.
    a: Vec<f32>,
    d: Vec<f32>,
    ssm_out: MatRef,
    dt_rank: usize,
}

/// Mamba-1's `ssm.*` metadata: the state's shape and the step's rank.
pub fn mamba1_config(m: &Meta<'_>) -> Result<(SsmConfig, usize)> {
    let (d_conv, d_inner) = (m.u("ssm.conv_kernel")?, m.u("ssm.inner_size")?);
    let (d_state, dt_rank) = (m.u("ssm.state_size")?, m.u("ssm.time_step_rank")?);
    // Bounded so that one layer's state (d_inner x d_state floats) is a
    // product that cannot overflow and a size a model could have.
    if [d_conv, d_inner, d_state, dt_rank].contains(&0)
        || d_inner > MAX_DIM
        || d_conv > 64
        || d_state > 1024
        || dt_rank > d_inner
    {
        return Err(Error::load(format!(
            "{} ssm shape is out of range or inconsistent: conv kernel {d_conv}, inner \
             {d_inner}, state {d_state}, time step rank {dt_rank}",
            m.arch
        )));
    }
    let c = SsmConfig {
        d_conv,
        d_inner,
        d_state,
        n_group: 0,
        n_head: d_inner,
    };
    Ok((c, dt_rank))
}

/// What the scan reads for every row of a pass: the convolved x and the
/// step (`d_inner` each), the normed step input with B and C (`dt_rank + 2
/// d_state`), and the in-projection (x then z, `2 d_inner`).
struct ScanIo<'a> {
    x: &'a [f32],
    dt: &'a [f32],
    xdb: &'a [f32],
    xz: &'a [f32],
    di: usize,
    ds: usize,
    r: usize,
}

/// Channels times states below which one sequence's scan stays on this
/// thread (a decode step of a small model).
const PAR_SCAN_MIN: usize = 1 << 16;

impl Mamba1Mixer {
    /// Rows `rows` of one sequence through the scan, the skip and the gate
    /// into `att`, advancing its `ssm` state. Channels are independent, so
    /// with enough work they are split over the pool, each block taking
    /// every row in order; a channel's arithmetic is the same either way,
    /// and so are the bits.
    fn scan_rows(
        &self,
        pool: &ThreadPool,
        ssm: &mut [f32],
        rows: Range<usize>,
        io: &ScanIo<'_>,
        att: &mut [f32],
    ) {
        let (di, ds, r) = (io.di, io.ds, io.r);
        let w = r + 2 * ds;
        let out = SharedMut::new(att);
        let block = |c0: usize, c1: usize, st: &mut [f32]| {
            for t in rows.clone() {
                let (b, c) = io.xdb[t * w + r..(t + 1) * w].split_at(ds);
                let x = &io.x[t * di + c0..t * di + c1];
                let dt = &io.dt[t * di + c0..t * di + c1];
                // SAFETY: row t's channels c0..c1 of `att`; the blocks of
                // one call cover disjoint channel ranges, and each block
                // holds one row's slice at a time.
                let y = unsafe { out.slice(t * di + c0, c1 - c0) };
                scan_step_mamba1(st, x, dt, &self.a[c0 * ds..c1 * ds], b, c, y);
                let z = &io.xz[t * 2 * di + di + c0..t * 2 * di + di + c1];
                let d = &self.d[c0..c1];
                for (((v, &xv), &dv), &zv) in y.iter_mut().zip(x).zip(d).zip(z) {
                    *v = (*v + xv * dv) * (zv / (1.0 + (-zv).exp()));
                }
            }
        };
        if pool.n_threads() < 2 || rows.len() * di * ds < PAR_SCAN_MIN {
            return block(0, di, ssm);
        }
        // Two blocks a thread, as `ThreadPool::for_rows` splits rows.
        let per = di.div_ceil(2 * pool.n_threads());
        let state = SharedMut::new(ssm);
        pool.run(di.div_ceil(per), |i| {
            let (c0, c1) = (i * per, ((i + 1) * per).min(di));
            // SAFETY: block i alone holds channels c0..c1 of the state.
            let st = unsafe { state.slice(c0 * ds, (c1 - c0) * ds) };
            block(c0, c1, st);
        });
    }

    /// Layer `t.il`'s mixer, every tensor required as llama.cpp requires
    /// them for Jamba.
    pub fn load(t: &Tensors<'_>, c: &SsmConfig, dt_rank: usize, n_embd: usize) -> Result<Self> {
        let (di, ds) = (c.d_inner, c.d_state);
        // A and D carry no `.weight` suffix in llama.cpp's names.
        let bare = |name: &str, len: usize| vector(t.f, &format!("blk.{}.{name}", t.il), len);
        Ok(Mamba1Mixer {
            ssm_in: t.matrix("ssm_in", n_embd, 2 * di)?,
            conv_w: t.vector("ssm_conv1d", di * c.d_conv)?,
            conv_b: t.bias("ssm_conv1d", di)?,
            ssm_x: t.matrix("ssm_x", di, dt_rank + 2 * ds)?,
            dt_norm: t.vector("ssm_dt_norm", dt_rank)?,
            b_norm: t.vector("ssm_b_norm", ds)?,
            c_norm: t.vector("ssm_c_norm", ds)?,
            ssm_dt: t.matrix("ssm_dt", dt_rank, di)?,
            dt_b: t.bias("ssm_dt", di)?,
            a: bare("ssm_a", di * ds)?,
            d: bare("ssm_d", di)?,
            ssm_out: t.matrix("ssm_out", di, n_embd)?,
            dt_rank,
        })
    }

    /// `s.h` (`n x n_embd`, normalized) through the mixer into `s.o`,
    /// advancing each segment's state of layer `il`. Uses the attention
    /// buffers (`q`, `k`, `v`, `att`) and `gate`/`up` as its own: a layer
    /// has either this mixer or attention.
    pub fn forward(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        let Some(c) = p.cfg.ssm else { return };
        let (n, e, f, eps) = (p.n, p.cfg.n_embd, p.file, p.cfg.norm_eps);
        let (di, ds, r) = (c.d_inner, c.d_state, self.dt_rank);
        matmul(
            p.pool,
            self.ssm_in.view(f),
            &s.h,
            n,
            fit(&mut s.gate, n * 2 * di),
            &mut s.acts,
        );
        crate::lora::apply(p, &self.ssm_in, &s.h, &mut s.gate);
        // The convolution first, row by row per sequence: what follows
        // up to the scan is a product over every row.
        let xc = fit(&mut s.up, n * di);
        for (g, seg) in p.segs.iter_mut().enumerate() {
            let Some(rec) = seg.rec.as_deref_mut() else {
                continue;
            };
            let Some((conv, _)) = rec.layer_mut(il) else {
                continue;
            };
            for t in p.starts[g]..p.starts[g + 1] {
                let x = &s.gate[t * 2 * di..t * 2 * di + di];
                let out = &mut xc[t * di..(t + 1) * di];
                conv_step(conv, x, &self.conv_w, &self.conv_b, c.d_conv, out);
            }
        }
        let w = r + 2 * ds;
        matmul(
            p.pool,
            self.ssm_x.view(f),
            &s.up,
            n,
            fit(&mut s.q, n * w),
            &mut s.acts,
        );
        crate::lora::apply(p, &self.ssm_x, &s.up, &mut s.q);
        let dt_in = fit(&mut s.k, n * r);
        for (row, dt) in s.q.chunks_exact_mut(w).zip(dt_in.chunks_exact_mut(r)) {
            let (dtr, bc) = row.split_at_mut(r);
            let (b, cc) = bc.split_at_mut(ds);
            rms_norm_inplace(dtr, &self.dt_norm, eps, 0.0);
            rms_norm_inplace(b, &self.b_norm, eps, 0.0);
            rms_norm_inplace(cc, &self.c_norm, eps, 0.0);
            dt.copy_from_slice(dtr);
        }
        matmul(
            p.pool,
            self.ssm_dt.view(f),
            &s.k,
            n,
            fit(&mut s.v, n * di),
            &mut s.acts,
        );
        crate::lora::apply(p, &self.ssm_dt, &s.k, &mut s.v);
        for row in s.v.chunks_exact_mut(di) {
            row.iter_mut().zip(&self.dt_b).for_each(|(v, &b)| *v += b);
        }
        fit(&mut s.att, n * di);
        let io = ScanIo {
            x: &s.up,
            dt: &s.v,
            xdb: &s.q,
            xz: &s.gate,
            di,
            ds,
            r,
        };
        for (g, seg) in p.segs.iter_mut().enumerate() {
            let Some(rec) = seg.rec.as_deref_mut() else {
                continue;
            };
            let Some((_, ssm)) = rec.layer_mut(il) else {
                continue;
            };
            let rows = p.starts[g]..p.starts[g + 1];
            self.scan_rows(p.pool, ssm, rows, &io, &mut s.att);
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
