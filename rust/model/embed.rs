//! Hidden states for embeddings: many sequences through scratch forward
//! passes that leave no session behind. Each sequence attends only within
//! itself (its own pages of a pass-local KV pool, position 0 up), and
//! consecutive sequences share a pass until it holds `max_rows` rows, so
//! 256 short sentences cost a handful of matrix products, not 256.

use std::sync::Arc;

use super::forward::Model;
use super::kv_cache::{KvCache, KvDtype};
use super::kv_pool::{KvPool, PAGE};
use super::pass::{Scratch, Segment};
use crate::lora::ActiveLora;
use crate::ops::vec::VecKernels;
use crate::threadpool::ThreadPool;
use crate::{Error, Result};

/// The last hidden state of every token of every sequence, `sum(len) x
/// n_embd`, sequence after sequence. `max_len` bounds one sequence (the
/// caller's context size; a longer one is an error naming its index),
/// `max_rows` one pass; `loras` apply to every row.
pub fn embed_hidden(
    model: &Model,
    pool: &ThreadPool,
    vk: &VecKernels,
    seqs: &[Vec<u32>],
    (max_len, max_rows): (usize, usize),
    loras: &[ActiveLora],
) -> Result<Vec<f32>> {
    let c = &model.cfg;
    for l in loras {
        if !l.adapter.fits(&model.file) {
            return Err(Error::lora("the LoRA adapter was loaded for another model"));
        }
        if !l.scale.is_finite() {
            return Err(Error::invalid(format!(
                "LoRA scale must be finite, got {}",
                l.scale
            )));
        }
    }
    if c.ssm.is_some() {
        return Err(Error::invalid(format!(
            "embeddings are not supported for the recurrent architecture {}",
            c.arch
        )));
    }
    if seqs.is_empty() {
        return Err(Error::invalid("embed needs at least one sequence"));
    }
    let n_vocab = model.n_vocab();
    for (i, s) in seqs.iter().enumerate() {
        if s.is_empty() {
            return Err(Error::invalid(format!("input {i} has no tokens")));
        }
        if s.len() > max_len {
            return Err(Error::invalid(format!(
                "input {i} has {} tokens, more than the context size of {max_len}",
                s.len()
            )));
        }
        if let Some(&bad) = s.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(Error::invalid(format!(
                "input {i}: token id {bad} is outside the vocabulary of {n_vocab}"
            )));
        }
    }
    // An encoder's keys and values never leave the pass: f32 as llama.cpp
    // keeps them. A decoder's go through llama.cpp's f16 cache there, so
    // the same rounding here gives the same vectors.
    let dtype = if c.causal { KvDtype::F16 } else { KvDtype::F32 };
    let e = c.n_embd;
    let total: usize = seqs.iter().map(Vec::len).sum();
    let mut out = vec![0f32; total * e];
    let mut scratch = Scratch::default();
    let (mut first, mut row0) = (0, 0);
    while first < seqs.len() {
        // At least one sequence per pass, then as many as fit.
        let mut last = first + 1;
        let mut rows = seqs[first].len();
        while last < seqs.len() && rows + seqs[last].len() <= max_rows.max(1) {
            rows += seqs[last].len();
            last += 1;
        }
        let group = &seqs[first..last];
        let pages = group.iter().map(|s| s.len().div_ceil(PAGE)).sum();
        let kv_pool = Arc::new(KvPool::for_shape(dtype, c.kv_shape(), pages)?);
        let mut caches = group
            .iter()
            .map(|s| {
                let mut kv = KvCache::with_pool(Arc::clone(&kv_pool), s.len());
                kv.reserve(0, s.len())?;
                Ok(kv)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut segs: Vec<Segment<'_>> = caches
            .iter_mut()
            .zip(group)
            .map(|(kv, tokens)| Segment {
                kv,
                tokens,
                pos0: 0,
                decode_rows: false,
                rec: None,
                lora: loras,
                // The hidden states of every row are read, never logits.
                all_rows: false,
            })
            .collect();
        let dst = &mut out[row0 * e..(row0 + rows) * e];
        model.forward_hidden(pool, vk, &mut segs, &mut scratch, dst)?;
        first = last;
        row0 += rows;
    }
    Ok(out)
}
