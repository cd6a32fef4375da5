//! Hyper-parameters read from GGUF metadata. The keys every transformer
//! shares are read here; each architecture's file reads its own extras
//! (softcaps, multipliers, rope factors) into the same struct, so the
//! shared forward pass sees plain numbers and no architecture names.

use super::kv_pool::KvShape;
use crate::gguf::{Array, GgufFile, Value};
use crate::ops::rope::{RopeOrder, RopeScaling};
use crate::{Error, Result};

/// Which normalization an architecture uses for its layer and output norms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    Rms,
    /// LayerNorm; the bias tensor is optional per architecture.
    Layer,
}

/// A state-space shape (`ssm.*` metadata): Mamba-2's, LFM2's convolution
/// (`d_state` 0), or Mamba-1's (Jamba): `n_group` 0, as its convolution
/// carries x alone (B and C come after it, from `ssm_x`), and one head per
/// channel (`n_head == d_inner`), each with its own decay per state, as
/// llama.cpp lays Mamba-1 out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SsmConfig {
    pub d_conv: usize,
    pub d_inner: usize,
    pub d_state: usize,
    pub n_group: usize,
    pub n_head: usize,
}

impl SsmConfig {
    pub fn head_dim(&self) -> usize {
        self.d_inner / self.n_head
    }
    /// Channels through the causal convolution: x, B and C (x alone in
    /// Mamba-1).
    pub fn conv_dim(&self) -> usize {
        self.d_inner + 2 * self.n_group * self.d_state
    }
    /// Floats of one layer's convolution state (the last `d_conv - 1`
    /// inputs of every channel).
    pub fn conv_len(&self) -> usize {
        (self.d_conv - 1) * self.conv_dim()
    }
    /// Floats of one layer's SSM state.
    pub fn ssm_len(&self) -> usize {
        self.d_inner * self.d_state
    }
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub arch: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub dim_k: usize,
    pub dim_v: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub norm: NormKind,
    pub norm_eps: f32,
    pub rope_order: RopeOrder,
    pub rope_base: f32,
    pub rope_base_local: f32,
    pub rope_dims: usize,
    pub rope_scaling: RopeScaling,
    /// `rope.scaling.attn_factor`: scales cos/sin (outside YaRN, whose
    /// own factor already includes it).
    pub rope_attn_factor: f32,
    /// Keys masked for a query `d` or more positions back on local layers.
    pub sliding_window: Option<usize>,
    /// Which layers use the sliding window (and the local rope base).
    pub swa_layers: Vec<bool>,
    /// Local layers' rope scaling (none unless the family scales them like
    /// its global layers, as gpt-oss does).
    pub rope_scaling_local: RopeScaling,
    /// Layers whose q and k get no rotary embedding (SmolLM3's NoPE).
    pub nope_layers: Vec<bool>,
    pub attn_scale: f32,
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
    /// Logits are multiplied by this (Command-R's scale, Granite's 1/scale).
    pub logit_mul: f32,
    /// Token embeddings are multiplied by this (Gemma's sqrt(n_embd),
    /// Granite's embedding multiplier).
    pub embed_mul: Option<f32>,
    /// Each block's output is multiplied by this before the residual add.
    pub residual_mul: f32,
    /// Recurrent (Mamba-2) and hybrid (LFM2, Granite-4.0-H) models: the
    /// state a session carries beside (or instead of) keys and values.
    pub ssm: Option<SsmConfig>,
    /// Layers that carry a recurrent state and keep no keys and values
    /// (all of a Mamba-2's; a hybrid's convolution or SSM layers; none of
    /// an attention model's, which leaves this empty).
    pub recr_layers: Vec<bool>,
    /// Llama-4 style attention temperature: queries at position `p` are
    /// multiplied by `ln(floor(p / floor) + 1) * scale + 1`.
    pub attn_temp: Option<(f32, usize)>,
    /// Layers from this one on keep no keys and values of their own: each
    /// attends over the cache of the last earlier layer of its kind
    /// (Gemma-3n's shared KV layers).
    pub kv_from_start: Option<usize>,
    /// `<arch>.attention.causal`: false for an encoder (BERT), whose
    /// queries see their whole sequence; such a model embeds, it cannot
    /// generate.
    pub causal: bool,
    /// Values are not stored: each is the first `dim_v` elements of its
    /// key row (DeepSeek's MLA caches the latent `c_kv` once, as the key's
    /// head and as the value).
    pub kv_v_in_k: bool,
    /// Where the rotated part of each cached key row starts (MLA keeps
    /// RoPE's dimensions after the latent); 0 for ordinary heads.
    pub kv_rope_offset: usize,
}

/// Typed access to `<arch>.<key>` metadata, with errors naming the key.
pub struct Meta<'a> {
    pub f: &'a GgufFile,
    pub arch: &'a str,
}

impl Meta<'_> {
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    pub fn opt_u(&self, k: &str) -> Result<Option<usize>> {
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
    pub fn u(&self, k: &str) -> Result<usize> {
        self.opt_u(k)?
            .ok_or_else(|| Error::load(format!("metadata {} is missing", self.key(k))))
    }
    pub fn opt_f(&self, k: &str) -> Result<Option<f32>> {
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
    /// A positive finite number, or `None` when absent or zero (converters
    /// write 0 for "off").
    pub fn opt_pos_f(&self, k: &str) -> Result<Option<f32>> {
        match self.opt_f(k)? {
            Some(x) if x < 0.0 => Err(Error::load(format!(
                "metadata {} must not be negative, got {x}",
                self.key(k)
            ))),
            Some(x) if x > 0.0 => Ok(Some(x)),
            _ => Ok(None),
        }
    }
    pub fn opt_str(&self, k: &str) -> Option<&str> {
        self.f.get(&self.key(k)).and_then(|v| v.as_str())
    }
}

/// Dimensions big enough for any real model yet small enough that products
/// of two of them cannot overflow.
pub const MAX_DIM: usize = 1 << 20;

impl ModelConfig {
    /// The keys every attention architecture shares. `arch` is known to be
    /// one we run; its loader then reads what is specific to it.
    /// A recurrent architecture has no attention heads (its converter
    /// writes a head count of 0); one nominal head keeps the shared
    /// arithmetic defined.
    pub fn from_gguf(f: &GgufFile, arch: &str, recurrent: bool) -> Result<Self> {
        let m = Meta { f, arch };
        let n_layer = m.u("block_count")?;
        let n_embd = m.u("embedding_length")?;
        // One width for every layer, or (Gemma-3n's converter) one per layer.
        let n_ff = match per_layer_u(&m, "feed_forward_length", n_layer)? {
            None => 0,
            Some(PerLayer::One(v)) => v,
            Some(PerLayer::Each(ff)) => {
                let first = ff.first().copied().unwrap_or(0);
                if ff.iter().any(|&v| v != first) {
                    return Err(Error::load(format!(
                        "metadata {arch}.feed_forward_length differs between layers \
                         ({ff:?}): not supported"
                    )));
                }
                first
            }
        };
        let mut recr_layers = Vec::new();
        let (n_head, n_head_kv) = if recurrent {
            (1, 1)
        } else {
            let n_head = m.opt_u("attention.head_count")?.unwrap_or(1);
            let n_head_kv = match per_layer_u(&m, "attention.head_count_kv", n_layer)? {
                None => n_head,
                Some(PerLayer::One(v)) => v,
                Some(PerLayer::Each(kv)) => {
                    // A hybrid (LFM2, Granite-4.0-H) writes 0 for the
                    // layers without attention, as llama.cpp reads them.
                    recr_layers = kv.iter().map(|&v| v == 0).collect();
                    let mut heads = kv.iter().copied().filter(|&v| v != 0);
                    let first = heads.next().unwrap_or(n_head);
                    if heads.any(|v| v != first) {
                        return Err(Error::load(format!(
                            "metadata {arch}.attention.head_count_kv differs between \
                             attention layers ({kv:?}): not supported"
                        )));
                    }
                    first
                }
            };
            (n_head, n_head_kv)
        };
        for (name, v) in [
            ("block_count", n_layer),
            ("embedding_length", n_embd),
            ("attention.head_count", n_head),
            ("attention.head_count_kv", n_head_kv),
        ] {
            if v == 0 || v > MAX_DIM {
                return Err(Error::load(format!(
                    "metadata {arch}.{name} = {v} is out of range"
                )));
            }
        }
        if n_ff > MAX_DIM {
            return Err(Error::load(format!(
                "metadata {arch}.feed_forward_length = {n_ff} is out of range"
            )));
        }
        if n_head % n_head_kv != 0 {
            return Err(Error::load(format!(
                "head_count {n_head} is not a multiple of head_count_kv {n_head_kv}"
            )));
        }
        let dim_k = match recurrent {
            true => 2,
            false => m.opt_u("attention.key_length")?.unwrap_or(n_embd / n_head),
        };
        let dim_v = match recurrent {
            true => 2,
            false => m.opt_u("attention.value_length")?.unwrap_or(dim_k),
        };
        if dim_k == 0 || dim_v == 0 || dim_k > 4096 || dim_v > 4096 {
            return Err(Error::load(format!(
                "head dimensions {dim_k}/{dim_v} are out of range"
            )));
        }
        let rope_dims = match recurrent {
            true => 0,
            false => m.opt_u("rope.dimension_count")?.unwrap_or(dim_k),
        };
        if rope_dims > dim_k || rope_dims % 2 != 0 {
            return Err(Error::load(format!(
                "rope.dimension_count {rope_dims} must be even and at most the head size {dim_k}"
            )));
        }
        let rope_base = m.opt_f("rope.freq_base")?.unwrap_or(10_000.0);
        let n_ctx_train = m.opt_u("context_length")?.unwrap_or(2048);
        let rope_scaling = rope_scaling(&m, n_ctx_train)?;
        let rope_attn_factor = m.opt_f("rope.scaling.attn_factor")?.unwrap_or(1.0);
        let rms_eps = m.opt_f("attention.layer_norm_rms_epsilon")?;
        let ln_eps = m.opt_f("attention.layer_norm_epsilon")?;
        let (norm, norm_eps) = match (rms_eps, ln_eps) {
            (Some(e), _) => (NormKind::Rms, e),
            (None, Some(e)) => (NormKind::Layer, e),
            (None, None) => (NormKind::Rms, 1e-5),
        };
        Ok(ModelConfig {
            attn_scale: 1.0 / (dim_k as f32).sqrt(),
            rope_base_local: rope_base,
            n_vocab: 0,
            arch: arch.to_string(),
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            dim_k,
            dim_v,
            n_ctx_train,
            norm,
            norm_eps,
            rope_order: RopeOrder::Normal,
            rope_base,
            rope_dims,
            rope_scaling,
            rope_attn_factor,
            sliding_window: None,
            swa_layers: Vec::new(),
            rope_scaling_local: RopeScaling::None,
            nope_layers: Vec::new(),
            attn_softcap: None,
            final_softcap: None,
            logit_mul: 1.0,
            embed_mul: None,
            residual_mul: 1.0,
            ssm: None,
            recr_layers,
            attn_temp: None,
            kv_from_start: None,
            causal: true,
            kv_v_in_k: false,
            kv_rope_offset: 0,
        })
    }

    /// Whether layer `il` uses the sliding window (and the local rope base).
    pub fn is_local_layer(&self, il: usize) -> bool {
        self.sliding_window.is_some() && self.swa_layers.get(il).copied().unwrap_or(false)
    }

    /// Whether layer `il` rotates its queries and keys.
    pub fn uses_rope(&self, il: usize) -> bool {
        !self.nope_layers.get(il).copied().unwrap_or(false)
    }

    /// Reads `attention.sliding_window` and the layer pattern as llama.cpp
    /// does: `sliding_window_pattern` is either one flag per layer or a
    /// period `p` (layer `il` is local when `il % p < p - 1`, so the last
    /// of every `p` layers attends globally); `default_pattern` otherwise.
    pub fn read_sliding_window(
        &mut self,
        m: &Meta<'_>,
        default_window: Option<usize>,
        default_pattern: usize,
    ) -> Result<()> {
        let window = m.opt_u("attention.sliding_window")?.or(default_window);
        self.sliding_window = window.filter(|&w| w > 0);
        let key = m.key("attention.sliding_window_pattern");
        self.swa_layers = match m.f.get(&key) {
            Some(Value::Array(Array::Bool(flags))) => {
                if flags.len() != self.n_layer {
                    return Err(Error::load(format!(
                        "metadata {key} has {} flags for {} layers",
                        flags.len(),
                        self.n_layer
                    )));
                }
                flags.clone()
            }
            Some(v) => {
                let p = v
                    .as_u64()
                    .and_then(|x| usize::try_from(x).ok())
                    .ok_or_else(|| {
                        Error::load(format!(
                            "metadata {key} must be an integer or flags, got {v:?}"
                        ))
                    })?;
                swa_period(self.n_layer, p)
            }
            None => swa_period(self.n_layer, default_pattern),
        };
        Ok(())
    }

    /// YaRN's beta and log-multiplier keys, for the architectures whose
    /// llama.cpp loader reads them.
    pub fn read_yarn_extras(&mut self, m: &Meta<'_>) -> Result<()> {
        if let RopeScaling::Yarn {
            beta_fast,
            beta_slow,
            log_mul,
            ..
        } = &mut self.rope_scaling
        {
            *beta_fast = m
                .opt_f("rope.scaling.yarn_beta_fast")?
                .unwrap_or(*beta_fast);
            *beta_slow = m
                .opt_f("rope.scaling.yarn_beta_slow")?
                .unwrap_or(*beta_slow);
            *log_mul = m.opt_f("rope.scaling.yarn_log_multiplier")?.unwrap_or(0.0);
        }
        Ok(())
    }

    /// Layers that keep keys and values (none in a recurrent model, the
    /// attention layers of a hybrid).
    pub fn kv_layers(&self) -> usize {
        let own = self.kv_from_start.unwrap_or(self.n_layer).min(self.n_layer);
        own - self.recr_layers.iter().take(own).filter(|&&r| r).count()
    }

    /// Whether layer `il` attends over an earlier layer's keys and values
    /// instead of storing its own.
    pub fn shares_kv(&self, il: usize) -> bool {
        self.kv_from_start.is_some_and(|k| il >= k)
    }

    /// The layer whose cache a sharing layer reads: the last one before
    /// `kv_from_start` of its kind (sliding or global), as llama.cpp maps
    /// them. The loader checks that those two layers are of those kinds.
    pub fn kv_source(&self, il: usize) -> usize {
        match self.kv_from_start {
            Some(k) if il >= k => k - if self.is_local_layer(il) { 2 } else { 1 },
            _ => il,
        }
    }

    /// Whether layer `il` carries a recurrent state instead of keys and
    /// values.
    pub fn is_recr_layer(&self, il: usize) -> bool {
        self.recr_layers.get(il).copied().unwrap_or(false)
    }

    /// The KV cache's layer of attention layer `il`: a hybrid's cache
    /// holds only its attention layers, in order.
    pub fn kv_index(&self, il: usize) -> usize {
        let il = self.kv_source(il);
        if self.recr_layers.is_empty() {
            return il;
        }
        il - self.recr_layers[..il].iter().filter(|&&r| r).count()
    }

    /// A hybrid: a recurrent state and a KV cache both.
    pub fn is_hybrid(&self) -> bool {
        self.ssm.is_some() && self.kv_layers() > 0
    }

    /// What one position of the KV cache holds, per layer.
    pub fn kv_shape(&self) -> KvShape {
        KvShape {
            n_layer: self.kv_layers(),
            n_head_kv: self.n_head_kv,
            dim_k: self.dim_k,
            dim_v: self.dim_v,
            v_in_k: self.kv_v_in_k,
        }
    }

    /// Widths of the q, k, v projections and of the attention output.
    pub fn attn_dims(&self) -> (usize, usize, usize, usize) {
        (
            self.n_head * self.dim_k,
            self.n_head_kv * self.dim_k,
            self.n_head_kv * self.dim_v,
            self.n_head * self.dim_v,
        )
    }

    /// Whether the output head applies anything after the matrix product.
    pub fn has_logit_transform(&self) -> bool {
        self.final_softcap.is_some() || self.logit_mul != 1.0
    }
}

/// A per-layer key: one value for every layer, or one each.
pub enum PerLayer {
    One(usize),
    Each(Vec<usize>),
}

/// `<arch>.<k>` as a number or an array of `n_layer` non-negative integers.
pub fn per_layer_u(m: &Meta<'_>, k: &str, n_layer: usize) -> Result<Option<PerLayer>> {
    let key = m.key(k);
    let Some(v) = m.f.get(&key) else {
        return Ok(None);
    };
    if let Value::Array(a) = v {
        let vals: Option<Vec<u64>> = match a {
            Array::U8(x) => Some(x.iter().map(|&v| v.into()).collect()),
            Array::U16(x) => Some(x.iter().map(|&v| v.into()).collect()),
            Array::U32(x) => Some(x.iter().map(|&v| v.into()).collect()),
            Array::U64(x) => Some(x.clone()),
            Array::I8(x) => x.iter().map(|&v| u64::try_from(v).ok()).collect(),
            Array::I16(x) => x.iter().map(|&v| u64::try_from(v).ok()).collect(),
            Array::I32(x) => x.iter().map(|&v| u64::try_from(v).ok()).collect(),
            Array::I64(x) => x.iter().map(|&v| u64::try_from(v).ok()).collect(),
            _ => None,
        };
        let vals = vals
            .filter(|v| v.len() == n_layer)
            .and_then(|v| {
                v.into_iter()
                    .map(|x| usize::try_from(x).ok().filter(|&x| x <= MAX_DIM))
                    .collect::<Option<Vec<usize>>>()
            })
            .ok_or_else(|| {
                Error::load(format!(
                    "metadata {key} must be {n_layer} non-negative integers (one per layer)"
                ))
            })?;
        return Ok(Some(PerLayer::Each(vals)));
    }
    v.as_u64()
        .and_then(|x| usize::try_from(x).ok())
        .map(|x| Some(PerLayer::One(x)))
        .ok_or_else(|| {
            Error::load(format!(
                "metadata {key} must be a non-negative integer, got {v:?}"
            ))
        })
}

fn swa_period(n_layer: usize, p: usize) -> Vec<bool> {
    (0..n_layer).map(|il| p == 0 || il % p < p - 1).collect()
}

fn rope_scaling(m: &Meta<'_>, n_ctx_train: usize) -> Result<RopeScaling> {
    let scaling_type = m.opt_str("rope.scaling.type").unwrap_or("none");
    let factor = m.opt_f("rope.scaling.factor")?.unwrap_or(1.0);
    Ok(match scaling_type {
        "none" => RopeScaling::None,
        _ if factor <= 1.0 => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor },
        "yarn" => RopeScaling::Yarn {
            factor,
            original_ctx: m
                .opt_u("rope.scaling.original_context_length")?
                .unwrap_or(n_ctx_train) as u32,
            // llama.cpp reads the beta and log-multiplier keys only for
            // some architectures (see `read_yarn_extras`).
            beta_fast: 32.0,
            beta_slow: 1.0,
            attn_factor: m.opt_f("rope.scaling.attn_factor")?.unwrap_or(1.0),
            log_mul: 0.0,
        },
        other => {
            return Err(Error::load(format!(
                "unsupported rope.scaling.type {other:?}"
            )));
        }
    })
}
