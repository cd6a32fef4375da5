//! One file per architecture family, each holding its `load` (which reads
//! its metadata extras and its tensors) and its `layer` (composed from the
//! shared blocks). `ARCHS` is the one list of names we run; a file whose
//! `general.architecture` is not in it is refused naming it. The families
//! implement `family::Arch` and never import this file, which names them;
//! only the forward pass imports it, to find a file's entry.

pub mod bert;
pub mod command_r;
pub mod deepseek2;
pub mod gemma;
pub mod gemma3n;
pub mod gpt_oss;
pub mod granite_hybrid;
pub mod jamba;
pub mod lfm2;
pub mod llama;
pub mod mamba2;
pub mod olmo2;
pub mod phi3;
pub mod starcoder2;

use super::family::ArchEntry;
use crate::{Error, Result};

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
        name: "smollm3",
        recurrent: false,
        load: llama::load_smollm3,
    },
    ArchEntry {
        name: "gpt-oss",
        recurrent: false,
        load: gpt_oss::load,
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
        name: "gemma3n",
        recurrent: false,
        load: gemma3n::load,
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
    ArchEntry {
        name: "lfm2",
        recurrent: false,
        load: lfm2::load,
    },
    ArchEntry {
        name: "lfm2moe",
        recurrent: false,
        load: lfm2::load_lfm2moe,
    },
    ArchEntry {
        name: "granitehybrid",
        recurrent: false,
        load: granite_hybrid::load,
    },
    ArchEntry {
        name: "jamba",
        recurrent: false,
        load: jamba::load,
    },
    ArchEntry {
        name: "deepseek2",
        recurrent: false,
        load: deepseek2::load,
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
