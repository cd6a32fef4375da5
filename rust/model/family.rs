//! What an architecture hands the shared model, and how the model finds
//! it: the `Arch` trait (one layer's computation), `Loaded` (what a loader
//! returns, with an encoder's `EncoderInput`) and `ArchEntry` (one row of
//! the registry). The registry itself, `arch::ARCHS`, is filled in
//! `arch/mod.rs`; this file names no architecture, so the families import
//! it and nothing here imports them.

use super::blocks::norm::Norm;
use super::config::ModelConfig;
use super::pass::{Pass, Scratch};
use super::weights::MatRef;
use crate::gguf::GgufFile;
use crate::quant::dequantize_row;
use crate::{Error, Result};

/// A loaded architecture: its layers and the order its blocks run in.
pub trait Arch: Send + Sync {
    /// Layer `il` over every row of the pass: reads the residual stream
    /// `s.x` and leaves the layer's output there.
    fn layer(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize);
}

/// What an architecture's loader hands the shared model.
pub struct Loaded {
    pub arch: Box<dyn Arch>,
    /// The output head is the token embedding even if `output.weight`
    /// exists (Command-R).
    pub tied_output: bool,
    /// An encoder's position and token-type embeddings and their norm.
    pub encoder: Option<EncoderInput>,
    /// The final norm's tensor name, without `.weight` (LFM2 names it
    /// `token_embd_norm`).
    pub output_norm: &'static str,
}

impl Loaded {
    pub fn plain(arch: impl Arch + 'static) -> Self {
        Loaded {
            arch: Box::new(arch),
            tied_output: false,
            encoder: None,
            output_norm: "output_norm",
        }
    }
}

/// One architecture name we run, and how to load it.
pub struct ArchEntry {
    pub name: &'static str,
    /// Carries a recurrent state instead of keys and values.
    pub recurrent: bool,
    /// Reads the architecture's metadata into `cfg` and its tensors.
    pub load: fn(&GgufFile, &mut ModelConfig) -> Result<Loaded>,
}

/// What an encoder adds to the token embedding before the first layer.
pub struct EncoderInput {
    position: MatRef,
    /// Row 0 of `token_types`: every token is of type 0, as llama.cpp
    /// evaluates single texts.
    type0: Vec<f32>,
    norm: Norm,
}

impl EncoderInput {
    /// `position` holds one row per absolute position, `type0` the token
    /// type row every token gets, `norm` normalizes their sum.
    pub fn new(position: MatRef, type0: Vec<f32>, norm: Norm) -> Self {
        EncoderInput {
            position,
            type0,
            norm,
        }
    }

    /// `x` (`rows_pos.len() x n_embd` token embeddings) plus position and
    /// type rows, normalized in place. A position past the table is an
    /// error naming it, never a read out of bounds.
    pub fn apply(&self, f: &GgufFile, rows_pos: &[usize], x: &mut [f32]) -> Result<()> {
        let e = self.type0.len();
        let table = self.position.view(f);
        let mut row = vec![0f32; e];
        for (t, &pos) in rows_pos.iter().enumerate() {
            if pos >= self.position.rows {
                return Err(Error::generate(format!(
                    "position {pos} is past the model's {} position embeddings",
                    self.position.rows
                )));
            }
            dequantize_row(table.ty, table.row(pos), &mut row)?;
            let xr = &mut x[t * e..(t + 1) * e];
            for ((a, &p), &ty) in xr.iter_mut().zip(&row).zip(&self.type0) {
                *a += p + ty;
            }
        }
        self.norm.inplace_serial(x);
        Ok(())
    }
}
