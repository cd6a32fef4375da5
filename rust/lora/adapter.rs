//! One LoRA adapter as llama.cpp's `convert_lora_to_gguf.py` writes it:
//! `general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`,
//! and tensor pairs `<base>.lora_a` (`[n_in, rank]`) / `<base>.lora_b`
//! (`[rank, n_out]`); for `token_embd.weight` the pair is stored flipped
//! (`lora_a` `[rank, n_vocab]`, `lora_b` `[rank, n_embd]`). Everything is
//! checked against the base model before anything is kept; the tensors are
//! copied exactly (F16 stays F16 bits, every other type becomes f32).

use std::collections::HashMap;
use std::sync::Arc;

use super::targets::{targets, BaseModel, Target, TargetKind};
use crate::gguf::GgufFile;
use crate::quant::{dequantize_row, GgmlType};
use crate::{Error, Result};

/// A small matrix in its file's precision: F16 bits, or f32.
pub enum Store {
    F16(Vec<u16>),
    F32(Vec<f32>),
}

impl Store {
    fn read(f: &GgufFile, name: &str) -> Result<Store> {
        let t = f
            .tensor(name)
            .ok_or_else(|| Error::lora(format!("adapter tensor {name} is missing")))?;
        let data = f.tensor_data(t);
        let n = usize::try_from(t.n_elements())
            .map_err(|_| Error::lora(format!("adapter tensor {name} is too large")))?;
        Ok(match t.ty {
            GgmlType::F16 => {
                if data.len() != 2 * n {
                    return Err(Error::lora(format!(
                        "adapter tensor {name}: {} bytes for {n} f16 values",
                        data.len()
                    )));
                }
                Store::F16(
                    data.chunks_exact(2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]]))
                        .collect(),
                )
            }
            ty => {
                let mut out = vec![0f32; n];
                dequantize_row(ty, data, &mut out).map_err(|e| {
                    Error::lora(format!(
                        "adapter tensor {name} ({ty:?}) cannot be read: {e}"
                    ))
                })?;
                Store::F32(out)
            }
        })
    }

    /// The `cols x rows` transpose of a `rows x cols` matrix, same precision.
    pub(crate) fn transposed(&self, rows: usize, cols: usize) -> Store {
        fn tr<T: Copy + Default>(v: &[T], rows: usize, cols: usize) -> Vec<T> {
            let mut out = vec![T::default(); v.len()];
            for r in 0..rows {
                for c in 0..cols {
                    out[c * rows + r] = v[r * cols + c];
                }
            }
            out
        }
        match self {
            Store::F16(v) => Store::F16(tr(v, rows, cols)),
            Store::F32(v) => Store::F32(tr(v, rows, cols)),
        }
    }

    pub fn is_f16(&self) -> bool {
        matches!(self, Store::F16(_))
    }
}

/// One modified base tensor.
pub struct LoraWeight {
    /// The base tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    pub kind: TargetKind,
    pub rank: usize,
    pub n_in: usize,
    pub n_out: usize,
    /// Matmul: `rank x n_in` (`t = A x`). Embedding: `n_vocab x rank`.
    pub a: Store,
    /// `B` transposed, `rank x n_out`, so the delta is `rank` axpys.
    pub bt: Store,
}

pub struct LoraAdapter {
    pub alpha: f32,
    pub arch: String,
    pub name: Option<String>,
    pub weights: Vec<LoraWeight>,
    /// Base tensor offset -> index in `weights`, for products.
    by_offset: HashMap<usize, usize>,
    embedding: Option<usize>,
    /// Identity of the base model's file: an adapter applies only there.
    base: usize,
}

/// An adapter active on a session, with the user's scale.
#[derive(Clone)]
pub struct ActiveLora {
    pub adapter: Arc<LoraAdapter>,
    pub scale: f32,
}

fn meta_str<'a>(f: &'a GgufFile, key: &str) -> Option<&'a str> {
    f.get(key).and_then(|v| v.as_str())
}

impl LoraAdapter {
    pub fn load(f: &GgufFile, model: &BaseModel<'_>) -> Result<LoraAdapter> {
        match meta_str(f, "general.type") {
            Some("adapter") => {}
            other => {
                return Err(Error::lora(format!(
                    "not a LoRA adapter: general.type is {other:?}, expected \"adapter\""
                )))
            }
        }
        match meta_str(f, "adapter.type") {
            Some("lora") => {}
            other => {
                return Err(Error::lora(format!(
                    "unsupported adapter: adapter.type is {other:?}, expected \"lora\""
                )))
            }
        }
        let arch = meta_str(f, "general.architecture").unwrap_or("");
        if arch != model.cfg.arch {
            return Err(Error::lora(format!(
                "adapter architecture {arch:?} does not match the model's {:?}",
                model.cfg.arch
            )));
        }
        if f.get("adapter.alora.invocation_tokens").is_some() {
            return Err(Error::lora(
                "adapter.alora.invocation_tokens: activated LoRA (aLoRA) is not supported",
            ));
        }
        // llama.cpp reads a missing alpha as 0, which means "scale as given".
        let alpha = match f.get("adapter.lora.alpha") {
            None => 0.0,
            Some(v) => v
                .as_f64()
                .map(|a| a as f32)
                .filter(|a| a.is_finite())
                .ok_or_else(|| Error::lora("adapter.lora.alpha is not a finite number"))?,
        };
        let allowed = targets(model);
        // Pair the tensors by base name, in file order.
        let mut pairs: Vec<(String, Option<String>, Option<String>)> = Vec::new();
        for t in f.tensors() {
            let (base, is_a) = if let Some(b) = t.name.strip_suffix(".lora_a") {
                (b, true)
            } else if let Some(b) = t.name.strip_suffix(".lora_b") {
                (b, false)
            } else {
                return Err(Error::lora(format!(
                    "adapter tensor {} is not a .lora_a / .lora_b pair member (only LoRA pairs are supported)",
                    t.name
                )));
            };
            let i = match pairs.iter().position(|p| p.0 == base) {
                Some(i) => i,
                None => {
                    pairs.push((base.to_string(), None, None));
                    pairs.len() - 1
                }
            };
            let slot = if is_a {
                &mut pairs[i].1
            } else {
                &mut pairs[i].2
            };
            if slot.replace(t.name.clone()).is_some() {
                return Err(Error::lora(format!(
                    "adapter tensor {} appears twice",
                    t.name
                )));
            }
        }
        if pairs.is_empty() {
            return Err(Error::lora("the adapter has no tensors"));
        }
        let mut weights = Vec::with_capacity(pairs.len());
        for (base, a, b) in pairs {
            let (Some(a), Some(b)) = (a, b) else {
                return Err(Error::lora(format!(
                    "LoRA pair for {base} is missing its {}",
                    if pairs_missing_a(&base, f) {
                        "lora_a"
                    } else {
                        "lora_b"
                    }
                )));
            };
            let tgt = check_target(model, &allowed, &base)?;
            weights.push(load_pair(f, &base, &a, &b, tgt)?);
        }
        let mut by_offset = HashMap::new();
        let mut embedding = None;
        for (i, w) in weights.iter().enumerate() {
            let t = allowed[&w.name];
            match w.kind {
                TargetKind::Matmul => {
                    by_offset.insert(t.offset, i);
                }
                TargetKind::Embedding => embedding = Some(i),
            }
        }
        Ok(LoraAdapter {
            alpha,
            arch: arch.to_string(),
            name: meta_str(f, "general.name").map(str::to_string),
            weights,
            by_offset,
            embedding,
            base: Arc::as_ptr(model.file) as usize,
        })
    }

    /// Whether this adapter was checked against the model of `file`.
    pub fn fits(&self, file: &Arc<GgufFile>) -> bool {
        self.base == Arc::as_ptr(file) as usize
    }

    /// The pair modifying the matrix stored at `offset`, if any.
    pub fn weight_at(&self, offset: usize) -> Option<&LoraWeight> {
        self.by_offset.get(&offset).map(|&i| &self.weights[i])
    }

    pub fn embedding(&self) -> Option<&LoraWeight> {
        self.embedding.map(|i| &self.weights[i])
    }

    /// llama.cpp's effective scale: `user * alpha / rank`, or `user` when
    /// alpha is 0 (computed in f32 in that order, as it does).
    pub fn scale_for(&self, w: &LoraWeight, user: f32) -> f32 {
        if self.alpha != 0.0 {
            user * self.alpha / w.rank as f32
        } else {
            user
        }
    }

    /// Bytes the adapter's tensors take in memory.
    pub fn nbytes(&self) -> usize {
        let sz = |s: &Store| match s {
            Store::F16(v) => v.len() * 2,
            Store::F32(v) => v.len() * 4,
        };
        self.weights.iter().map(|w| sz(&w.a) + sz(&w.bt)).sum()
    }
}

fn pairs_missing_a(base: &str, f: &GgufFile) -> bool {
    f.tensor(&format!("{base}.lora_a")).is_none()
}

fn check_target(
    model: &BaseModel<'_>,
    allowed: &HashMap<String, Target>,
    base: &str,
) -> Result<Target> {
    if let Some(t) = allowed.get(base) {
        return Ok(*t);
    }
    if model.file.tensor(base).is_none() {
        return Err(Error::lora(format!(
            "LoRA target {base} does not exist in the base model (another base model?)"
        )));
    }
    Err(Error::lora(format!(
        "LoRA target {base} is not supported: adapters may modify the attention and MLP \
         projections, and the embedding and output head when they are separate matrices"
    )))
}

fn dims2(f: &GgufFile, name: &str) -> Result<(usize, usize)> {
    let t = f
        .tensor(name)
        .ok_or_else(|| Error::lora(format!("adapter tensor {name} is missing")))?;
    if t.dims.len() != 2 {
        return Err(Error::lora(format!(
            "adapter tensor {name} has shape {:?}, expected 2 dimensions",
            t.dims
        )));
    }
    Ok((t.dims[0] as usize, t.dims[1] as usize))
}

fn load_pair(f: &GgufFile, base: &str, a: &str, b: &str, tgt: Target) -> Result<LoraWeight> {
    let (a0, a1) = dims2(f, a)?;
    let (b0, b1) = dims2(f, b)?;
    let bad = |what: &str| {
        Error::lora(format!(
            "LoRA pair for {base} has the wrong shape ({a} {:?}, {b} {:?}, base [{}, {}]): {what}",
            [a0, a1],
            [b0, b1],
            tgt.n_in,
            tgt.n_out
        ))
    };
    let (rank, n_in, n_out) = match tgt.kind {
        TargetKind::Matmul => {
            if a0 != tgt.n_in || b1 != tgt.n_out {
                return Err(bad("lora_a must be [n_in, rank] and lora_b [rank, n_out]"));
            }
            if a1 != b0 {
                return Err(bad("the ranks of lora_a and lora_b differ"));
            }
            (a1, a0, b1)
        }
        TargetKind::Embedding => {
            // n_in is the embedding width, n_out the vocabulary.
            if a1 != tgt.n_out || b1 != tgt.n_in {
                return Err(bad(
                    "for token_embd, lora_a must be [rank, n_vocab] and lora_b [rank, n_embd]",
                ));
            }
            if a0 != b0 {
                return Err(bad("the ranks of lora_a and lora_b differ"));
            }
            (a0, tgt.n_out, tgt.n_in)
        }
    };
    if rank == 0 {
        return Err(bad("rank 0"));
    }
    let sa = Store::read(f, a)?;
    let sb = Store::read(f, b)?;
    // lora_b's rows are its second dimension: b1 rows of `rank` values.
    let bt = sb.transposed(b1, rank);
    Ok(LoraWeight {
        name: base.to_string(),
        kind: tgt.kind,
        rank,
        n_in,
        n_out,
        a: sa,
        bt,
    })
}
