//! Hyper-parameters read from GGUF metadata, and the per-architecture
//! switches that let one forward pass serve the llama family.

use crate::gguf::GgufFile;
use crate::ops::rope::{RopeOrder, RopeScaling};
use crate::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (llama, mistral, qwen).
    Silu,
    /// GeGLU with tanh GELU (gemma).
    GeluTanh,
}

/// What distinguishes one llama-family architecture from another. Adding a
/// variant means filling in one of these, not copying the forward pass.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchTraits {
    pub rope_order: RopeOrder,
    pub qkv_bias: bool,
    /// Per-head RMSNorm of q and k before RoPE (gemma3, qwen3).
    pub qk_norm: bool,
    /// Extra RMSNorm after attention and after the FFN, before the residual.
    pub post_norms: bool,
    /// Multiply embeddings by sqrt(n_embd) (gemma).
    pub scale_embeddings: bool,
    pub activation: Activation,
    /// Every `n`th layer attends globally; the others use the sliding window.
    pub sliding_pattern: Option<usize>,
}

impl ArchTraits {
    pub fn for_arch(arch: &str) -> Option<Self> {
        let llama = ArchTraits {
            rope_order: RopeOrder::Normal,
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            scale_embeddings: false,
            activation: Activation::Silu,
            sliding_pattern: None,
        };
        Some(match arch {
            "llama" | "mistral" | "granite" => llama,
            "qwen2" => ArchTraits {
                rope_order: RopeOrder::Neox,
                qkv_bias: true,
                ..llama
            },
            "qwen3" => ArchTraits {
                rope_order: RopeOrder::Neox,
                qk_norm: true,
                ..llama
            },
            "gemma3" => ArchTraits {
                rope_order: RopeOrder::Neox,
                qk_norm: true,
                post_norms: true,
                scale_embeddings: true,
                activation: Activation::GeluTanh,
                sliding_pattern: Some(6),
                ..llama
            },
            _ => return None,
        })
    }
}

pub const SUPPORTED_ARCHS: &[&str] = &["llama", "mistral", "granite", "qwen2", "qwen3", "gemma3"];

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub arch: String,
    pub traits: ArchTraits,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub dim_k: usize,
    pub dim_v: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    pub rope_base_local: f32,
    pub rope_dims: usize,
    pub rope_scaling: RopeScaling,
    pub sliding_window: Option<usize>,
    pub attn_scale: f32,
}

struct Meta<'a> {
    f: &'a GgufFile,
    arch: &'a str,
}

impl Meta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    fn opt_u(&self, k: &str) -> Result<Option<usize>> {
        let key = self.key(k);
        match self.f.get(&key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| {
                    Error::load(format!(
                        "metadata {key} must be a non-negative integer, got {v:?}"
                    ))
                }),
        }
    }
    fn u(&self, k: &str) -> Result<usize> {
        self.opt_u(k)?
            .ok_or_else(|| Error::load(format!("metadata {} is missing", self.key(k))))
    }
    fn opt_f(&self, k: &str) -> Result<Option<f32>> {
        let key = self.key(k);
        match self.f.get(&key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(|x| Some(x as f32))
                .ok_or_else(|| {
                    Error::load(format!("metadata {key} must be a finite number, got {v:?}"))
                }),
        }
    }
}

/// Dimensions big enough for any real model yet small enough that products
/// of two of them cannot overflow.
const MAX_DIM: usize = 1 << 20;

impl ModelConfig {
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let arch = f
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .ok_or_else(|| Error::load("metadata general.architecture is missing"))?
            .to_string();
        let traits = ArchTraits::for_arch(&arch).ok_or_else(|| {
            Error::load(format!(
                "unsupported architecture {arch:?} (supported: {})",
                SUPPORTED_ARCHS.join(", ")
            ))
        })?;
        let m = Meta { f, arch: &arch };
        let n_layer = m.u("block_count")?;
        let n_embd = m.u("embedding_length")?;
        let n_ff = m.u("feed_forward_length")?;
        let n_head = m.u("attention.head_count")?;
        let n_head_kv = m.opt_u("attention.head_count_kv")?.unwrap_or(n_head);
        for (name, v) in [
            ("block_count", n_layer),
            ("embedding_length", n_embd),
            ("feed_forward_length", n_ff),
            ("attention.head_count", n_head),
            ("attention.head_count_kv", n_head_kv),
        ] {
            if v == 0 || v > MAX_DIM {
                return Err(Error::load(format!(
                    "metadata {arch}.{name} = {v} is out of range"
                )));
            }
        }
        if n_head % n_head_kv != 0 {
            return Err(Error::load(format!(
                "head_count {n_head} is not a multiple of head_count_kv {n_head_kv}"
            )));
        }
        let dim_k = m.opt_u("attention.key_length")?.unwrap_or(n_embd / n_head);
        let dim_v = m.opt_u("attention.value_length")?.unwrap_or(dim_k);
        if dim_k == 0 || dim_v == 0 || dim_k > 4096 || dim_v > 4096 {
            return Err(Error::load(format!(
                "head dimensions {dim_k}/{dim_v} are out of range"
            )));
        }
        let rope_dims = m.opt_u("rope.dimension_count")?.unwrap_or(dim_k);
        if rope_dims > dim_k || rope_dims % 2 != 0 {
            return Err(Error::load(format!(
                "rope.dimension_count {rope_dims} must be even and at most the head size {dim_k}"
            )));
        }
        let rope_base = m.opt_f("rope.freq_base")?.unwrap_or(10_000.0);
        let scaling_type = f
            .get(&m.key("rope.scaling.type"))
            .and_then(|v| v.as_str())
            .unwrap_or("none");
        let factor = m.opt_f("rope.scaling.factor")?.unwrap_or(1.0);
        let n_ctx_train = m.opt_u("context_length")?.unwrap_or(2048);
        let rope_scaling = match scaling_type {
            "none" => RopeScaling::None,
            _ if factor <= 1.0 => RopeScaling::None,
            "linear" => RopeScaling::Linear { factor },
            "yarn" => RopeScaling::Yarn {
                factor,
                original_ctx: m
                    .opt_u("rope.scaling.original_context_length")?
                    .unwrap_or(n_ctx_train) as u32,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attn_factor: m.opt_f("rope.scaling.attn_factor")?.unwrap_or(1.0),
            },
            other => {
                return Err(Error::load(format!(
                    "unsupported rope.scaling.type {other:?}"
                )));
            }
        };
        let sliding_window = match traits.sliding_pattern {
            Some(_) => m.opt_u("attention.sliding_window")?,
            None => None,
        };
        let rms_eps = m.opt_f("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5);
        Ok(ModelConfig {
            attn_scale: 1.0 / (dim_k as f32).sqrt(),
            rope_base_local: 10_000.0,
            n_vocab: 0,
            arch,
            traits,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            dim_k,
            dim_v,
            n_ctx_train,
            rms_eps,
            rope_base,
            rope_dims,
            rope_scaling,
            sliding_window,
        })
    }

    /// Whether layer `il` uses the sliding window (and the local rope base).
    pub fn is_local_layer(&self, il: usize) -> bool {
        match (self.traits.sliding_pattern, self.sliding_window) {
            (Some(p), Some(_)) => (il + 1) % p != 0,
            _ => false,
        }
    }
}
