//! Which base tensors an adapter may modify: exactly those whose products
//! go through `apply` (or the embedding lookup, `apply_embedding`). Any other
//! target is refused naming it, so no delta is ever dropped silently.

use std::collections::HashMap;
use std::sync::Arc;

use crate::gguf::GgufFile;
use crate::model::config::ModelConfig;

/// The base model an adapter is checked against: its file and config, and
/// where its token embedding and output head are stored (one offset when
/// the head is tied to the embedding). `Model::lora_base` gives one; the
/// LoRA code takes this rather than the model so that it stays below the
/// forward pass, which applies its deltas.
#[derive(Clone, Copy)]
pub struct BaseModel<'a> {
    pub file: &'a Arc<GgufFile>,
    pub cfg: &'a ModelConfig,
    pub tok_embd_offset: usize,
    pub output_offset: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// `out = W x`: the delta is `B (A x)` on the same rows.
    Matmul,
    /// The token embedding lookup: the delta is `B a[token]` (llama.cpp
    /// stores this pair flipped: `lora_a` is `[rank, n_vocab]`).
    Embedding,
}

#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub kind: TargetKind,
    /// Offset of the base tensor in the model file: how a product's matrix
    /// is recognised at run time, whatever the architecture.
    pub offset: usize,
    pub n_in: usize,
    pub n_out: usize,
}

/// Per-layer projections each architecture multiplies through the shared
/// blocks (or, for mamba2 and the hybrids, their mixers' own products), all
/// hooked. A name a layer lacks (an attention projection in a recurrent
/// layer of a hybrid) is simply not there to target.
fn layer_names(arch: &str, fused_qkv: bool) -> &'static [&'static str] {
    match arch {
        "mamba2" => &["ssm_in", "ssm_out"],
        // lfm2moe's routed experts are 3-D and not hooked: its dense layers'
        // MLPs are.
        "lfm2" | "lfm2moe" => &[
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "shortconv.in_proj",
            "shortconv.out_proj",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ],
        // The shared expert's products are not hooked, so refused.
        "granitehybrid" => &[
            "attn_qkv",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ssm_in",
            "ssm_out",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ],
        // Jamba's routed experts are 3-D and not hooked: its dense layers'
        // MLPs are.
        "jamba" => &[
            "attn_qkv",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ssm_in",
            "ssm_x",
            "ssm_dt",
            "ssm_out",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ],
        "phi3" if fused_qkv => &["attn_qkv", "attn_output", "ffn_up", "ffn_down"],
        "phi3" => &[
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_up",
            "ffn_down",
        ],
        "starcoder2" => &[
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_up",
            "ffn_down",
        ],
        // Routed experts (and the router) are 3-D or gate the routing; not
        // hooked, so refused.
        "qwen3moe" => &["attn_q", "attn_k", "attn_v", "attn_output"],
        _ => &[
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ],
    }
}

/// Every tensor name of `model` an adapter may target, with its shape.
pub fn targets(model: &BaseModel<'_>) -> HashMap<String, Target> {
    let f = &**model.file;
    let mut out = HashMap::new();
    let mut add = |name: String, kind: TargetKind| {
        if let Some(t) = f.tensor(&name) {
            if t.dims.len() == 2 {
                let (n_in, n_out) = (t.dims[0] as usize, t.dims[1] as usize);
                out.insert(
                    name,
                    Target {
                        kind,
                        offset: t.offset,
                        n_in,
                        n_out,
                    },
                );
            }
        }
    };
    let arch = model.cfg.arch.as_str();
    for il in 0..model.cfg.n_layer {
        let fused = f.tensor(&format!("blk.{il}.attn_qkv.weight")).is_some();
        for name in layer_names(arch, fused) {
            // A layer that reads an earlier layer's cache (Gemma-3n's last
            // layers) never multiplies by its own key and value matrices.
            if model.cfg.shares_kv(il) && matches!(*name, "attn_k" | "attn_v") {
                continue;
            }
            add(format!("blk.{il}.{name}.weight"), TargetKind::Matmul);
        }
    }
    let (embd, output) = (model.tok_embd_offset, model.output_offset);
    // A tied head multiplies by the embedding matrix: the lookup delta and
    // the head delta would need one pair in two layouts (llama.cpp fails
    // there), so neither is offered.
    if embd != output {
        add("token_embd.weight".into(), TargetKind::Embedding);
        if f.tensor("output.weight")
            .is_some_and(|t| t.offset == output)
        {
            add("output.weight".into(), TargetKind::Matmul);
        }
    }
    out
}
