//! One file per architecture family, each holding its `load` (which reads
//! its metadata extras and its tensors) and its `layer` (composed from the
//! shared blocks). `ARCHS` is the one list of names we run; a file whose
//! `general.architecture` is not in it is refused naming it.

pub mod bert;
pub mod command_r;
pub mod gemma;
pub mod llama;
pub mod mamba2;
pub mod olmo2;
pub mod phi3;
pub mod starcoder2;

use super::config::{Meta, ModelConfig};
use super::pass::{Pass, Scratch};
use super::weights::{opt_vector, vector};
use crate::gguf::GgufFile;
use crate::{Error, Result};

/// The loaded architecture. One `match` per layer, no `dyn` in the loop.
pub enum Arch {
    Llama(llama::Llama),
    Gemma(gemma::Gemma),
    Phi3(phi3::Phi3),
    CommandR(command_r::CommandR),
    Starcoder2(starcoder2::Starcoder2),
    Mamba2(mamba2::Mamba2),
    Olmo2(olmo2::Olmo2),
    Bert(bert::Bert),
}

impl Arch {
    pub fn layer(&self, p: &mut Pass<'_, '_, '_>, s: &mut Scratch, il: usize) {
        match self {
            Arch::Llama(a) => a.layer(p, s, il),
            Arch::Gemma(a) => a.layer(p, s, il),
            Arch::Phi3(a) => a.layer(p, s, il),
            Arch::CommandR(a) => a.layer(p, s, il),
            Arch::Starcoder2(a) => a.layer(p, s, il),
            Arch::Mamba2(a) => a.layer(p, s, il),
            Arch::Olmo2(a) => a.layer(p, s, il),
            Arch::Bert(a) => a.layer(p, s, il),
        }
    }
}

/// Per-pair rotary frequency factors: `rope_freqs` (Llama 3.1 style, one
/// set), or LongRoPE's `rope_factors_short` / `_long`, the long ones for a
/// session whose context exceeds `original_ctx` (as llama.cpp chooses).
pub struct RopeFactors {
    pub short: Vec<f32>,
    pub long: Vec<f32>,
    pub original_ctx: usize,
}

impl RopeFactors {
    pub fn read(f: &GgufFile, cfg: &ModelConfig) -> Result<Option<Self>> {
        let half = cfg.rope_dims / 2;
        if f.tensor("rope_freqs.weight").is_some() {
            let v = vector(f, "rope_freqs.weight", half)?;
            return Ok(Some(RopeFactors {
                short: v.clone(),
                long: v,
                original_ctx: usize::MAX,
            }));
        }
        let short = opt_vector(f, "rope_factors_short.weight", half)?;
        let long = opt_vector(f, "rope_factors_long.weight", half)?;
        match (short, long) {
            (None, None) => Ok(None),
            (Some(short), Some(long)) => {
                let m = Meta { f, arch: &cfg.arch };
                let original_ctx = m
                    .opt_u("rope.scaling.original_context_length")?
                    .unwrap_or(cfg.n_ctx_train);
                Ok(Some(RopeFactors {
                    short,
                    long,
                    original_ctx,
                }))
            }
            _ => Err(Error::load(
                "rope_factors_short and rope_factors_long must come together",
            )),
        }
    }
}

/// What an architecture's loader hands the shared model.
pub struct Loaded {
    pub arch: Arch,
    /// The output head is the token embedding even if `output.weight`
    /// exists (Command-R).
    pub tied_output: bool,
    /// An encoder's position and token-type embeddings and their norm.
    pub encoder: Option<bert::EncoderInput>,
}

impl Loaded {
    pub fn plain(arch: Arch) -> Self {
        Loaded {
            arch,
            tied_output: false,
            encoder: None,
        }
    }
}

pub struct ArchEntry {
    pub name: &'static str,
    /// Carries a recurrent state instead of keys and values.
    pub recurrent: bool,
    /// Reads the architecture's metadata into `cfg` and its tensors.
    pub load: fn(&GgufFile, &mut ModelConfig) -> Result<Loaded>,
}

pub const ARCHS: &[ArchEntry] = &[
    ArchEntry {
        name: "llama",
        recurrent: false,
        load: llama::load_llama,
    },
    ArchEntry {
        name: "mistral3",
        recurrent: false,
        load: llama::load_mistral3,
    },
    ArchEntry {
        name: "granite",
        recurrent: false,
        load: llama::load_granite,
    },
    ArchEntry {
        name: "qwen2",
        recurrent: false,
        load: llama::load_qwen2,
    },
    ArchEntry {
        name: "qwen3",
        recurrent: false,
        load: llama::load_qwen3,
    },
    ArchEntry {
        name: "qwen3moe",
        recurrent: false,
        load: llama::load_qwen3moe,
    },
    ArchEntry {
        name: "olmo2",
        recurrent: false,
        load: olmo2::load,
    },
    ArchEntry {
        name: "gemma",
        recurrent: false,
        load: gemma::load_gemma,
    },
    ArchEntry {
        name: "gemma2",
        recurrent: false,
        load: gemma::load_gemma2,
    },
    ArchEntry {
        name: "gemma3",
        recurrent: false,
        load: gemma::load_gemma3,
    },
    ArchEntry {
        name: "phi3",
        recurrent: false,
        load: phi3::load,
    },
    ArchEntry {
        name: "command-r",
        recurrent: false,
        load: command_r::load,
    },
    ArchEntry {
        name: "starcoder2",
        recurrent: false,
        load: starcoder2::load,
    },
    ArchEntry {
        name: "bert",
        recurrent: false,
        load: bert::load,
    },
    ArchEntry {
        name: "mamba2",
        recurrent: true,
        load: mamba2::load,
    },
];

/// The entry for `general.architecture == name`, or a `LoadError` naming
/// it and listing what we run.
pub fn find(name: &str) -> Result<&'static ArchEntry> {
    ARCHS.iter().find(|a| a.name == name).ok_or_else(|| {
        Error::load(format!(
            "unsupported architecture {name:?} (supported: {})",
            names().join(", ")
        ))
    })
}

pub fn names() -> Vec<&'static str> {
    ARCHS.iter().map(|a| a.name).collect()
}
