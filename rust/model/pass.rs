//! What a forward pass hands each layer: the batch's segments and their
//! row layout (`Segment`, `Pass`) and the activation buffers (`Scratch`).
//! The blocks, the architectures and the LoRA deltas all run on these;
//! this file names none of them, so they depend on it and not on the
//! model that drives the pass (`forward.rs`).

use super::config::ModelConfig;
use super::kv_cache::KvCache;
use super::recurrent::RecurrentState;
use crate::gguf::GgufFile;
use crate::lora::adapter::ActiveLora;
use crate::ops::matmul::ActScratch;
use crate::ops::rope::Rope;
use crate::ops::vec::VecKernels;
use crate::threadpool::ThreadPool;

/// One sequence of a batched forward pass.
pub struct Segment<'a> {
    pub kv: &'a mut KvCache,
    pub tokens: &'a [u32],
    /// Position of the first token.
    pub pos0: usize,
    /// Attend token by token with the one-token kernel, so each row's
    /// logits are bit-identical to evaluating the tokens one at a time
    /// (speculative verification relies on it).
    pub decode_rows: bool,
    /// Send every row of this segment through the output head, not only
    /// its last (a speculative verification needs the logits after each
    /// drafted token).
    pub all_rows: bool,
    /// A recurrent model's state for this sequence (`None` otherwise).
    pub rec: Option<&'a mut RecurrentState>,
    /// LoRA adapters active for this sequence (their deltas apply to its
    /// rows only).
    pub lora: &'a [ActiveLora],
}

/// What a layer needs besides its weights and the activations: the pool,
/// the model's shape, and where each segment's rows are.
pub struct Pass<'a, 's, 'k> {
    pub pool: &'a ThreadPool,
    pub vk: &'a VecKernels,
    pub file: &'a GgufFile,
    pub cfg: &'a ModelConfig,
    /// Applies the angles in `Scratch::cs`; only its pair order and width
    /// are used here, so one rope serves every segment.
    pub rope: &'a Rope,
    pub segs: &'s mut [Segment<'k>],
    /// Row where each segment starts, then the total.
    pub starts: Vec<usize>,
    pub rows_pos: Vec<usize>,
    pub n: usize,
}

/// Activation buffers for one forward chunk, reused across calls.
#[derive(Default)]
pub struct Scratch {
    pub x: Vec<f32>,
    pub h: Vec<f32>,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub att: Vec<f32>,
    /// The attention block's output.
    pub o: Vec<f32>,
    /// The feed-forward block's output.
    pub f: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub cs: Vec<f32>,
    pub cs_local: Vec<f32>,
    pub acts: ActScratch,
    /// Rows an architecture carries from layer to layer beside `x`
    /// (Gemma-3n's parallel AltUp streams).
    pub streams: Vec<f32>,
    /// Per-row inputs an architecture computes once per pass for all its
    /// layers (Gemma-3n's per-layer embeddings).
    pub per_layer: Vec<f32>,
}

impl Scratch {
    /// The last position's hidden state after the output norm, as the last
    /// forward left it (`n_embd` floats), if any.
    pub fn last_hidden(&self, n_embd: usize) -> Option<&[f32]> {
        (n_embd > 0 && self.h.len() >= n_embd).then(|| &self.h[self.h.len() - n_embd..])
    }

    /// The hidden state of head row `i` after a forward pass (one row per
    /// segment when not all logits were asked for).
    pub fn row_hidden(&self, i: usize, n_embd: usize) -> &[f32] {
        self.h.get(i * n_embd..(i + 1) * n_embd).unwrap_or(&[])
    }

    /// Makes `last_hidden` return `hidden` (a row taken from a batch).
    pub fn set_last_hidden(&mut self, hidden: &[f32]) {
        self.h.clear();
        self.h.extend_from_slice(hidden);
    }

    /// Keeps only head row `i` as the last hidden state.
    pub fn keep_row_hidden(&mut self, i: usize, n_embd: usize) {
        if i > 0 && (i + 1) * n_embd <= self.h.len() {
            self.h.copy_within(i * n_embd..(i + 1) * n_embd, 0);
        }
        self.h.truncate(n_embd);
    }

    /// Frees every buffer but the last position's hidden state, which
    /// stays readable through `last_hidden`. An idle session then costs its
    /// KV pages and `n_embd` floats, not a chunk's activations.
    pub fn shrink_to_last(&mut self, n_embd: usize) {
        let keep = self.last_hidden(n_embd).map(<[f32]>::to_vec);
        *self = Scratch::default();
        self.h = keep.unwrap_or_default();
    }
}

/// `v` resized to `n` (contents unspecified), as a slice.
pub fn fit(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    v.resize(n, 0.0);
    &mut v[..n]
}
