//! A sequence's key/value cache: a page table into a `KvPool`.
//!
//! Positions live in pages of `PAGE` (16) taken from the pool as the
//! sequence grows and given back when it shrinks or ends. An engine's own
//! session has a private pool as large as its context; the batching
//! scheduler gives all its sequences one shared pool, so memory follows the
//! tokens actually held, and sequences with a common prefix can hold the
//! same pages (copied on the first write after the fork). Pool memory is
//! an anonymous mapping, so the OS commits it only as pages are written.

use std::sync::Arc;

pub use super::kv_dtype::{KvDtype, KvRot, KvShape, KvTypes};
use super::kv_pool::{KvPool, Rows, RowsMut, Side, PAGE};
use crate::ops::hadamard;
use crate::quant::kv as kvq;
use crate::threadpool::{SharedMut, ThreadPool};
use crate::{Error, Result};

#[cfg(target_endian = "little")]
fn write_u16(src: &[u16], out: &mut [u8]) {
    // SAFETY: u16 has no padding and every bit pattern is a valid u8 pair;
    // on a little-endian target its memory is already the LE encoding.
    let b = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), src.len() * 2) };
    out.copy_from_slice(b);
}

#[cfg(not(target_endian = "little"))]
fn write_u16(src: &[u16], out: &mut [u8]) {
    for (x, o) in src.iter().zip(out.chunks_exact_mut(2)) {
        o.copy_from_slice(&x.to_le_bytes());
    }
}

#[cfg(target_endian = "little")]
fn write_f32(src: &[f32], out: &mut [u8]) {
    // SAFETY: as for u16: f32 has no padding and LE memory is the encoding.
    let b = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), src.len() * 4) };
    out.copy_from_slice(b);
}

#[cfg(not(target_endian = "little"))]
fn write_f32(src: &[f32], out: &mut [u8]) {
    for (x, o) in src.iter().zip(out.chunks_exact_mut(4)) {
        o.copy_from_slice(&x.to_le_bytes());
    }
}

/// A read view of one KV head's rows for positions `0..n` of a sequence.
#[derive(Clone, Copy)]
pub struct KvView<'a> {
    pool: &'a KvPool,
    pages: &'a [u32],
    layer: usize,
    side: Side,
    head: usize,
    n: usize,
    /// Values read from key rows: each row's first this many elements.
    prefix: Option<usize>,
}

impl<'a> KvView<'a> {
    /// For a view of values held in key rows: the storage units between
    /// rows and those of the part read (each row's first elements); `None`
    /// when rows are stored back to back as read.
    pub fn strided(&self) -> Option<(usize, usize)> {
        self.prefix.map(|d| {
            (
                self.pool.row_units(self.side),
                self.pool.prefix_units(self.side, d),
            )
        })
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    pub fn is_f16(&self) -> bool {
        self.dtype() == KvDtype::F16
    }

    /// The element type of this view's side.
    pub fn dtype(&self) -> KvDtype {
        self.pool.dtype.side(self.side)
    }

    /// Rows `j0..j1` (`j1` at most the end of `j0`'s page and `n`).
    pub fn rows(&self, j0: usize, j1: usize) -> Rows<'a> {
        let page = self.pages[j0 / PAGE];
        assert!(
            j1 <= self.n && j1 > j0 && (j1 - 1) / PAGE == j0 / PAGE,
            "rows cross a page"
        );
        // SAFETY: the view borrows the sequence's page table, whose pages the
        // sequence holds; a held page is written only by its sole holder
        // through `&mut KvCache`, which this borrow excludes.
        unsafe {
            self.pool.rows(
                self.layer,
                self.side,
                page,
                self.head,
                j0 % PAGE,
                (j1 - 1) % PAGE + 1,
            )
        }
    }

    /// Where the page holding row `j` ends.
    pub fn page_end(&self, j: usize) -> usize {
        ((j / PAGE + 1) * PAGE).min(self.n)
    }
}

pub struct KvCache {
    pub dtype: KvTypes,
    pub n_ctx: usize,
    pub n_head_kv: usize,
    pub dim_k: usize,
    pub dim_v: usize,
    pool: Arc<KvPool>,
    /// Page of positions `i * PAGE..(i + 1) * PAGE`.
    pages: Vec<u32>,
}

impl KvCache {
    /// A cache with a private pool of `n_ctx` positions.
    pub fn new(
        dtype: impl Into<KvTypes>,
        n_layer: usize,
        n_ctx: usize,
        n_head_kv: usize,
        dim_k: usize,
        dim_v: usize,
    ) -> Result<Self> {
        let pool = KvPool::new(
            dtype,
            n_layer,
            n_ctx.div_ceil(PAGE).max(1),
            n_head_kv,
            dim_k,
            dim_v,
        )?;
        Ok(Self::with_pool(Arc::new(pool), n_ctx))
    }

    /// A cache with a private pool of `n_ctx` positions for a model's shape.
    pub fn for_shape(dtype: impl Into<KvTypes>, shape: KvShape, n_ctx: usize) -> Result<Self> {
        let pool = KvPool::for_shape(dtype, shape, n_ctx.div_ceil(PAGE).max(1))?;
        Ok(Self::with_pool(Arc::new(pool), n_ctx))
    }

    /// A cache of at most `n_ctx` positions drawing pages from `pool`.
    pub fn with_pool(pool: Arc<KvPool>, n_ctx: usize) -> Self {
        KvCache {
            dtype: pool.dtype,
            n_ctx,
            n_head_kv: pool.n_head_kv,
            dim_k: pool.dim_k,
            dim_v: pool.dim_v,
            pool,
            pages: Vec::new(),
        }
    }

    pub fn pool(&self) -> &Arc<KvPool> {
        &self.pool
    }

    pub fn n_layer(&self) -> usize {
        self.pool.n_layer
    }

    /// The rotation this cache's rows are stored under (its pool's).
    pub fn rot(&self) -> KvRot {
        self.pool.rot
    }

    /// Pages this sequence holds.
    pub fn pages_held(&self) -> usize {
        self.pages.len()
    }

    /// Makes positions `from..to` writable: takes pages up to `to` from the
    /// pool and copies any page in that range that others also hold. On
    /// failure (pool exhausted) nothing written so far is lost; pages taken
    /// stay held and are reused by the next attempt.
    pub fn reserve(&mut self, from: usize, to: usize) -> Result<()> {
        if to > self.n_ctx {
            return Err(Error::generate(format!(
                "context overflow: {to} positions exceed the context size of {}",
                self.n_ctx
            )));
        }
        if from < to {
            let first = from / PAGE;
            for i in first..self.pages.len().min(to.div_ceil(PAGE)) {
                let p = self.pages[i];
                if self.pool.shared(p) {
                    let q = self.take_page()?;
                    // SAFETY: we hold `q` alone (fresh) and hold `p`, which
                    // its other holders only read.
                    unsafe { self.pool.copy_page(p, q) };
                    self.pages[i] = q;
                    self.pool.release(p);
                }
            }
        }
        while self.pages.len() < to.div_ceil(PAGE) {
            let p = self.take_page()?;
            self.pages.push(p);
        }
        Ok(())
    }

    /// Pages `reserve(from, to)` would take from the pool now (new pages
    /// and copies of shared ones), so a scheduler can make room first.
    pub fn pages_needed(&self, from: usize, to: usize) -> usize {
        let mut n = to.div_ceil(PAGE).saturating_sub(self.pages.len());
        if from < to {
            for i in from / PAGE..self.pages.len().min(to.div_ceil(PAGE)) {
                if self.pool.shared(self.pages[i]) {
                    n += 1;
                }
            }
        }
        n
    }

    fn take_page(&self) -> Result<u32> {
        self.pool.alloc().ok_or_else(|| {
            Error::kv_full(format!(
                "the KV pool is exhausted: all {} pages of {PAGE} positions are in use",
                self.pool.n_pages
            ))
        })
    }

    /// Gives back the pages past position `n`.
    pub fn truncate(&mut self, n: usize) {
        let keep = n.div_ceil(PAGE);
        while self.pages.len() > keep {
            if let Some(p) = self.pages.pop() {
                self.pool.release(p);
            }
        }
    }

    /// A new cache holding (not copying) the pages of positions `0..n`;
    /// either side's first write into a shared page copies it.
    pub fn fork(&self, n: usize) -> Result<KvCache> {
        let need = n.div_ceil(PAGE);
        if need > self.pages.len() {
            return Err(Error::invalid(format!(
                "cannot fork {n} positions: the cache holds {}",
                self.pages.len() * PAGE
            )));
        }
        let mut out = KvCache::with_pool(Arc::clone(&self.pool), self.n_ctx);
        for &p in &self.pages[..need] {
            self.pool.retain(p);
            out.pages.push(p);
        }
        Ok(out)
    }

    /// Stores one position's keys and values (all KV heads, post-RoPE).
    /// The position must be reserved. A cache that reads values from its
    /// keys (`v_in_k`) takes no values: `v` is ignored.
    pub fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let page = self.pages[pos / PAGE];
        for h in 0..self.n_head_kv {
            // SAFETY: `reserve` made the page ours alone, and `&mut self`
            // excludes readers of this sequence's views.
            unsafe {
                self.pool.write_row(
                    layer,
                    Side::K,
                    page,
                    h,
                    pos % PAGE,
                    &k[h * self.dim_k..(h + 1) * self.dim_k],
                );
                if !self.pool.v_in_k {
                    self.pool.write_row(
                        layer,
                        Side::V,
                        page,
                        h,
                        pos % PAGE,
                        &v[h * self.dim_v..(h + 1) * self.dim_v],
                    );
                }
            }
        }
    }

    fn view(&self, layer: usize, side: Side, h: usize, n: usize) -> KvView<'_> {
        assert!(
            n <= self.pages.len() * PAGE,
            "KV view past the reserved positions"
        );
        KvView {
            pool: &self.pool,
            pages: &self.pages,
            layer,
            side,
            head: h,
            n,
            prefix: None,
        }
    }

    /// Keys of head `h` for positions `0..n`.
    pub fn keys(&self, layer: usize, h: usize, n: usize) -> KvView<'_> {
        self.view(layer, Side::K, h, n)
    }

    /// Values of head `h` for positions `0..n`: the value rows, or each
    /// key row's first `dim_v` elements in a cache that stores no values.
    pub fn values(&self, layer: usize, h: usize, n: usize) -> KvView<'_> {
        if self.pool.v_in_k {
            return KvView {
                prefix: Some(self.dim_v),
                ..self.view(layer, Side::K, h, n)
            };
        }
        self.view(layer, Side::V, h, n)
    }

    /// Whether values are read from the key rows (nothing stored for them).
    pub fn v_in_k(&self) -> bool {
        self.pool.v_in_k
    }

    /// Context shift: of the first `n` positions, forgets
    /// `keep..keep + discard` and moves the rows after them down by
    /// `discard`, so the cache then holds `n - discard` contiguous positions.
    /// Every moved key row (one head, `dim_k` long) goes through
    /// `rotate(layer, row)`, which re-rotates it for its new position; the
    /// values move as they are. An f16 cache rounds the rotated keys to f16
    /// again, as llama.cpp's K-shift does. Keys stored under a Hadamard
    /// rotation (`KvRot`) are rotated back before RoPE and again after it
    /// (RoPE does not commute with it), as llama.cpp's K-shift does for a
    /// rotated cache. Pages shared with other sequences are copied first,
    /// so they never see the move.
    pub fn shift(
        &mut self,
        keep: usize,
        discard: usize,
        n: usize,
        rotate: &(dyn Fn(usize, &mut [f32]) + Sync),
        pool: &ThreadPool,
    ) -> Result<()> {
        if keep + discard > n || n > (self.pages.len() * PAGE).min(self.n_ctx) {
            return Err(Error::invalid(format!(
                "cannot shift: keep {keep} + discard {discard} of {n} positions \
                 (the cache holds {})",
                (self.pages.len() * PAGE).min(self.n_ctx)
            )));
        }
        if discard == 0 {
            return Ok(());
        }
        self.reserve(keep, n)?;
        let (kv_pool, pages, n_head_kv) = (&*self.pool, &self.pages[..], self.n_head_kv);
        let all = [(Side::K, self.dim_k), (Side::V, self.dim_v)];
        let dims = &all[..self.pool.stored_sides().len()];
        let rot_k = self.pool.rot.k;
        // Layers are independent; each pool thread moves whole layers. Rows
        // move down in increasing order, so a source row is read before
        // anything is written over it.
        pool.run(self.n_layer(), |l| {
            let mut row = Vec::new();
            for &(side, d) in dims {
                row.resize(d, 0.0);
                for h in 0..n_head_kv {
                    for j in keep + discard..n {
                        let to = j - discard;
                        // SAFETY: `reserve(keep, n)` made the pages of
                        // `keep..n` ours alone, and each layer's rows are
                        // touched by one chunk only; the source row is
                        // copied out before the (different) target row is
                        // borrowed mutably.
                        unsafe {
                            match kv_pool.rows(l, side, pages[j / PAGE], h, j % PAGE, j % PAGE + 1)
                            {
                                Rows::F16(x) => {
                                    for (d, &b) in row.iter_mut().zip(x) {
                                        *d = half::f16::from_bits(b).to_f32();
                                    }
                                }
                                Rows::F32(x) => row.copy_from_slice(x),
                                // Quantized rows go through f32 and back, as
                                // llama.cpp's K-shift does; a value row comes
                                // back to the same bytes (ggml's q8_0/q4_0
                                // requantize their own output exactly).
                                Rows::Q8_0(x) => kvq::dequantize_q8_0(x, &mut row),
                                Rows::Q4_0(x) => kvq::dequantize_q4_0(x, &mut row),
                            }
                            if side == Side::K {
                                hadamard::rotate(&mut row, rot_k);
                                rotate(l, &mut row);
                                hadamard::rotate(&mut row, rot_k);
                            }
                            kv_pool.write_row(l, side, pages[to / PAGE], h, to % PAGE, &row);
                        }
                    }
                }
            }
        });
        self.truncate(n - discard);
        Ok(())
    }

    /// Bytes that `export(n)` produces.
    pub fn export_len(&self, n: usize) -> usize {
        self.n_layer() * self.layer_len(n)
    }

    /// Exported bytes of one layer's `n` positions.
    fn layer_len(&self, n: usize) -> usize {
        let one = KvShape {
            n_layer: 1,
            ..self.pool.shape()
        };
        n * one.position_bytes(self.dtype)
    }

    /// The first `n` positions of every layer as raw little-endian data in
    /// the cache's dtype: per layer, K of each head then V of each head
    /// (each head's positions in order).
    pub fn export(&self, n: usize, pool: &ThreadPool) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.export_len(n.min(self.n_ctx))];
        self.export_into(n, &mut out, pool)?;
        Ok(out)
    }

    /// `export` into a caller's buffer of exactly `export_len(n)` bytes, so a
    /// snapshot can place the KV straight into its file image (one copy).
    /// Layers are copied in parallel: one thread's memcpy bandwidth is well
    /// below the machine's (24 MB took 4.1 ms on one thread).
    pub fn export_into(&self, n: usize, out: &mut [u8], pool: &ThreadPool) -> Result<()> {
        if n > self.pages.len() * PAGE || n > self.n_ctx {
            return Err(Error::invalid(format!(
                "cannot export {n} positions: the cache holds {}",
                (self.pages.len() * PAGE).min(self.n_ctx)
            )));
        }
        if out.len() != self.export_len(n) {
            return Err(Error::invalid(format!(
                "KV export needs {} bytes, the buffer has {}",
                self.export_len(n),
                out.len()
            )));
        }
        let per_layer = self.layer_len(n);
        let dst = SharedMut::new(out);
        pool.run(self.n_layer(), |l| {
            // SAFETY: layer `l` writes only its own `per_layer` bytes, and
            // `out` (length checked above: n_layer * per_layer) outlives `run`.
            let out = unsafe { dst.slice(l * per_layer, per_layer) };
            let mut off = 0;
            for &side in self.pool.stored_sides() {
                for h in 0..self.n_head_kv {
                    let view = self.view(l, side, h, n);
                    let mut j = 0;
                    while j < n {
                        let end = view.page_end(j);
                        let rows = view.rows(j, end);
                        let bytes = match rows {
                            Rows::F16(x) => {
                                write_u16(x, &mut out[off..off + x.len() * 2]);
                                x.len() * 2
                            }
                            Rows::F32(x) => {
                                write_f32(x, &mut out[off..off + x.len() * 4]);
                                x.len() * 4
                            }
                            // Quantized blocks are exported as stored.
                            Rows::Q8_0(x) | Rows::Q4_0(x) => {
                                out[off..off + x.len()].copy_from_slice(x);
                                x.len()
                            }
                        };
                        off += bytes;
                        j = end;
                    }
                }
            }
        });
        Ok(())
    }

    /// Replaces the contents with `n` positions of exported data; `data`
    /// must be exactly `export_len(n)` bytes. The cache then holds fresh
    /// pages for exactly those positions.
    pub fn import(&mut self, n: usize, data: &[u8], pool: &ThreadPool) -> Result<()> {
        self.import_at(0, &[(n, data)], pool)
    }

    /// Keeps positions `0..start` and writes the positions of `blocks`
    /// after them, one block after another: each `(p, data)` is an export
    /// of `p` positions (`export_len(p)` bytes, the layout of `export`),
    /// as the prefix store keeps them. Everything is checked before the
    /// cache changes; the positions written get pages of their own.
    pub fn import_at(
        &mut self,
        start: usize,
        blocks: &[(usize, &[u8])],
        pool: &ThreadPool,
    ) -> Result<()> {
        let added = blocks
            .iter()
            .try_fold(0usize, |t, &(p, _)| t.checked_add(p));
        let end = added.and_then(|a| a.checked_add(start));
        let Some(end) = end.filter(|&e| e <= self.n_ctx) else {
            return Err(Error::invalid(format!(
                "the snapshot or stored blocks hold positions past the context size of {}",
                self.n_ctx
            )));
        };
        if start > self.pages.len() * PAGE {
            return Err(Error::invalid(format!(
                "cannot import at position {start}: the cache holds {}",
                self.pages.len() * PAGE
            )));
        }
        for &(p, data) in blocks {
            if data.len() != self.export_len(p) {
                return Err(Error::invalid(format!(
                    "KV data is {} bytes, expected {} for {p} positions",
                    data.len(),
                    self.export_len(p)
                )));
            }
        }
        self.truncate(start);
        self.reserve(start, end)?;
        let (kv_pool, pages, n_head_kv) = (&*self.pool, &self.pages[..], self.n_head_kv);
        let all = [
            (Side::K, self.dtype.k.row_bytes(self.dim_k)),
            (Side::V, self.dtype.v.row_bytes(self.dim_v)),
        ];
        let dims = &all[..self.pool.stored_sides().len()];
        let layer_len = |p: usize| self.layer_len(p);
        // Layers are independent: each pool thread fills whole layers (the
        // first touch of the pages is most of the cost).
        pool.run(self.n_layer(), |l| {
            let mut pos = start;
            for &(p, data) in blocks {
                let mut off = l * layer_len(p);
                for &(side, d) in dims {
                    for h in 0..n_head_kv {
                        let mut j = pos;
                        while j < pos + p {
                            let stop = ((j / PAGE + 1) * PAGE).min(pos + p);
                            let len = (stop - j) * d;
                            // SAFETY: `reserve(start, end)` made the pages
                            // of these positions ours alone (fresh, or
                            // copies of shared ones), and each layer is
                            // written by one chunk only.
                            let rows = unsafe {
                                kv_pool.rows_mut(
                                    l,
                                    side,
                                    pages[j / PAGE],
                                    h,
                                    j % PAGE,
                                    (stop - 1) % PAGE + 1,
                                )
                            };
                            read_le(rows, &data[off..off + len]);
                            off += len;
                            j = stop;
                        }
                    }
                }
                pos += p;
            }
        });
        Ok(())
    }
}

impl Drop for KvCache {
    fn drop(&mut self) {
        self.truncate(0);
    }
}

fn read_le(rows: RowsMut<'_>, bytes: &[u8]) {
    match rows {
        RowsMut::F16(v) => {
            for (d, c) in v.iter_mut().zip(bytes.chunks_exact(2)) {
                *d = u16::from_le_bytes([c[0], c[1]]);
            }
        }
        RowsMut::F32(v) => {
            for (d, c) in v.iter_mut().zip(bytes.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        RowsMut::Q8_0(v) | RowsMut::Q4_0(v) => v.copy_from_slice(bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_import_round_trip() {
        for dtype in [KvDtype::F16, KvDtype::F32] {
            let mut a = KvCache::new(dtype, 2, 40, 2, 4, 3).unwrap();
            a.reserve(0, 37).unwrap();
            for pos in 0..37 {
                let k: Vec<f32> = (0..8).map(|i| (pos * 10 + i) as f32).collect();
                let v: Vec<f32> = (0..6).map(|i| -((pos * 10 + i) as f32)).collect();
                a.store(0, pos, &k, &v);
                a.store(
                    1,
                    pos,
                    &v.iter().chain(&v).copied().take(8).collect::<Vec<_>>(),
                    &k[..6],
                );
            }
            let pool = ThreadPool::new(2);
            // 37 positions: two full pages and a partial third.
            let bytes = a.export(37, &ThreadPool::new(1)).unwrap();
            assert_eq!(bytes.len(), a.export_len(37));
            assert_eq!(
                a.export(37, &pool).unwrap(),
                bytes,
                "parallel export differs"
            );
            // Positions in export order: layer, side, head, position.
            let row = |l: usize, side: usize, h: usize, pos: usize, d: usize, i: usize| {
                let (dk, dv, heads, es) = (4, 3, 2, dtype.unit());
                let layer = heads * 37 * (dk + dv);
                let start = l * layer
                    + if side == 0 {
                        h * 37 * dk + pos * dk
                    } else {
                        heads * 37 * dk + h * 37 * dv + pos * dv
                    }
                    + i;
                let _ = d;
                match dtype {
                    KvDtype::F32 => {
                        f32::from_le_bytes(bytes[start * es..start * es + 4].try_into().unwrap())
                    }
                    KvDtype::F16 => half::f16::from_bits(u16::from_le_bytes(
                        bytes[start * es..start * es + 2].try_into().unwrap(),
                    ))
                    .to_f32(),
                    KvDtype::Q8_0 | KvDtype::Q4_0 => unreachable!("float types only"),
                }
            };
            assert_eq!(row(0, 0, 1, 33, 4, 2), (33 * 10 + 4 + 2) as f32);
            assert_eq!(row(0, 1, 0, 20, 3, 1), -((20 * 10 + 1) as f32));
            let mut b = KvCache::new(dtype, 2, 48, 2, 4, 3).unwrap();
            b.import(37, &bytes, &pool).unwrap();
            assert_eq!(b.export(37, &pool).unwrap(), bytes);
            assert!(b.import(37, &bytes[1..], &pool).is_err());
            assert!(b.import(49, &bytes, &pool).is_err());
        }
    }
}

#[cfg(test)]
mod shift_tests {
    use super::*;
    use crate::ops::rope::{Rope, RopeOrder, RopeScaling};

    fn key(pos: usize, h: usize, d: usize) -> Vec<f32> {
        (0..d)
            .map(|i| (((pos * 31 + h * 7 + i * 13) % 17) as f32 - 8.0) / 4.0)
            .collect()
    }

    /// After a shift, each kept key equals the raw key rotated at its new
    /// position (up to f16 rounding), values are moved unchanged, and the
    /// first `keep` positions are untouched; for both rope orders.
    #[test]
    fn shifted_keys_are_rope_at_the_new_position() {
        let (n_head, dk, dv, n, keep, discard) = (2, 8, 4, 45, 5, 20);
        for order in [RopeOrder::Normal, RopeOrder::Neox] {
            for dtype in [KvDtype::F16, KvDtype::F32] {
                let rope = Rope::new(order, 6, 10000.0, &RopeScaling::None);
                let mut cs = vec![0f32; 6];
                // The raw key of token `tok`, rotated for position `pos`.
                let rotated = |tok: usize, pos: usize, cs: &mut [f32]| {
                    let mut k: Vec<f32> = (0..n_head).flat_map(|h| key(tok, h, dk)).collect();
                    rope.angles(pos, cs);
                    rope.apply(&mut k, dk, cs);
                    k
                };
                let mut c = KvCache::new(dtype, 2, 64, n_head, dk, dv).unwrap();
                c.reserve(0, n).unwrap();
                for pos in 0..n {
                    let k = rotated(pos, pos, &mut cs);
                    let v: Vec<f32> = (0..n_head * dv).map(|i| (pos * 100 + i) as f32).collect();
                    c.store(0, pos, &k, &v);
                    c.store(1, pos, &k, &v);
                }
                let t = ThreadPool::new(2);
                let before = c.export(n, &t).unwrap();
                let mut sh = vec![0f32; 6];
                rope.shift_angles(-(discard as i64), &mut sh);
                c.shift(keep, discard, n, &|_, row| rope.apply(row, dk, &sh), &t)
                    .unwrap();
                let m = n - discard;
                assert_eq!(c.pages_held(), m.div_ceil(PAGE));
                let after = c.export(m, &t).unwrap();
                let at = |b: &[u8], i: usize| match dtype {
                    KvDtype::F32 => f32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()),
                    KvDtype::F16 => half::f16::from_bits(u16::from_le_bytes(
                        b[i * 2..i * 2 + 2].try_into().unwrap(),
                    ))
                    .to_f32(),
                    other => unreachable!("this test stores f16 and f32 caches, not {other:?}"),
                };
                for l in 0..2 {
                    let (lb, la) = (l * n_head * n * (dk + dv), l * n_head * m * (dk + dv));
                    for h in 0..n_head {
                        for pos in 0..m {
                            let old = if pos < keep { pos } else { pos + discard };
                            let want = rotated(old, pos, &mut cs);
                            for i in 0..dk {
                                let got = at(&after, la + h * m * dk + pos * dk + i);
                                let w = want[h * dk + i];
                                let tol = if dtype == KvDtype::F16 { 1e-2 } else { 1e-4 };
                                assert!(
                                    (got - w).abs() <= tol,
                                    "{order:?} {dtype:?} K l{l} h{h} p{pos}[{i}]: {got} vs {w}"
                                );
                                if pos < keep {
                                    assert_eq!(got, at(&before, lb + h * n * dk + old * dk + i));
                                }
                            }
                            for i in 0..dv {
                                let got =
                                    at(&after, la + n_head * m * dk + h * m * dv + pos * dv + i);
                                let was =
                                    at(&before, lb + n_head * n * dk + h * n * dv + old * dv + i);
                                assert_eq!(got, was, "V moved unchanged");
                            }
                        }
                    }
                }
                assert!(c.shift(10, 30, m, &|_, _| {}, &t).is_err());
            }
        }
    }

    /// A cache whose keys are stored Hadamard-rotated: after a shift each
    /// kept key is the rotation of the raw key's RoPE at its new position
    /// (f32: to rounding; q8_0: to its quantization), values move as
    /// stored.
    #[test]
    fn shifted_rotated_keys_are_rotated_rope_at_the_new_position() {
        let (n_head, dk, dv, n, keep, discard) = (2, 64, 64, 40, 3, 17);
        let rot = KvRot { k: 64, v: 64 };
        let rope = Rope::new(RopeOrder::Neox, 48, 10000.0, &RopeScaling::None);
        let mut cs = vec![0f32; 48];
        let stored = |tok: usize, pos: usize, cs: &mut [f32]| {
            let mut k: Vec<f32> = (0..n_head).flat_map(|h| key(tok, h, dk)).collect();
            rope.angles(pos, cs);
            rope.apply(&mut k, dk, cs);
            hadamard::rotate(&mut k, rot.k);
            k
        };
        for (dtype, tol) in [(KvDtype::F32, 1e-4), (KvDtype::Q8_0, 0.05)] {
            let pool = Arc::new(KvPool::with_rot(dtype, 1, 4, n_head, dk, dv, rot).unwrap());
            let mut c = KvCache::with_pool(pool, 64);
            assert_eq!(c.rot(), rot);
            c.reserve(0, n).unwrap();
            for pos in 0..n {
                let v: Vec<f32> = (0..n_head * dv).map(|i| ((pos + i) % 9) as f32).collect();
                c.store(0, pos, &stored(pos, pos, &mut cs), &v);
            }
            let t = ThreadPool::new(2);
            let before = c.export(n, &t).unwrap();
            let mut sh = vec![0f32; 48];
            rope.shift_angles(-(discard as i64), &mut sh);
            c.shift(keep, discard, n, &|_, row| rope.apply(row, dk, &sh), &t)
                .unwrap();
            let m = n - discard;
            let after = c.export(m, &t).unwrap();
            let (rk, rv) = (dtype.row_bytes(dk), dtype.row_bytes(dv));
            let mut got = vec![0f32; dk];
            for h in 0..n_head {
                for pos in 0..m {
                    let old = if pos < keep { pos } else { pos + discard };
                    let want = stored(old, pos, &mut cs);
                    let at = (h * m + pos) * rk;
                    decode_row_for_test(dtype, &after[at..at + rk], &mut got);
                    for (i, (g, w)) in got.iter().zip(&want[h * dk..]).enumerate() {
                        assert!(
                            (g - w).abs() <= tol,
                            "{dtype:?} h{h} p{pos}[{i}]: {g} vs {w}"
                        );
                    }
                    let (va, vb) = (
                        n_head * m * rk + (h * m + pos) * rv,
                        n_head * n * rk + (h * n + old) * rv,
                    );
                    assert_eq!(after[va..va + rv], before[vb..vb + rv], "V moved as stored");
                }
            }
        }
    }

    fn decode_row_for_test(t: KvDtype, src: &[u8], dst: &mut [f32]) {
        match t {
            KvDtype::F32 => {
                for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                    *d = f32::from_le_bytes(c.try_into().unwrap());
                }
            }
            KvDtype::Q8_0 => kvq::dequantize_q8_0(src, dst),
            other => unreachable!("this test stores f32 and q8_0 caches, not {other:?}"),
        }
    }

    /// A shift copies pages it shares with a fork before moving rows, so
    /// the fork keeps its own view.
    #[test]
    fn a_shift_leaves_a_fork_alone() {
        let pool = Arc::new(KvPool::new(KvDtype::F32, 1, 10, 1, 2, 2).unwrap());
        let t = ThreadPool::new(1);
        let mut a = KvCache::with_pool(Arc::clone(&pool), 64);
        a.reserve(0, 40).unwrap();
        for pos in 0..40 {
            a.store(0, pos, &[pos as f32, 0.0], &[pos as f32, 1.0]);
        }
        let b = a.fork(40).unwrap();
        let before = b.export(40, &t).unwrap();
        a.shift(4, 18, 40, &|_, _| {}, &t).unwrap();
        assert_eq!(b.export(40, &t).unwrap(), before);
        let ea = a.export(22, &t).unwrap();
        let k = |i: usize| f32::from_le_bytes(ea[i * 8..i * 8 + 4].try_into().unwrap());
        assert_eq!((k(3), k(4), k(21)), (3.0, 22.0, 39.0));
    }
}

#[cfg(test)]
mod pool_tests {
    use super::*;

    fn filled(pool: &Arc<KvPool>, n: usize, seed: f32) -> KvCache {
        let mut c = KvCache::with_pool(Arc::clone(pool), 64);
        c.reserve(0, n).unwrap();
        for pos in 0..n {
            let k: Vec<f32> = (0..4).map(|i| seed + (pos * 4 + i) as f32).collect();
            c.store(0, pos, &k, &k[..2]);
        }
        c
    }

    #[test]
    fn sequences_share_a_pool_and_return_their_pages() {
        let pool = Arc::new(KvPool::new(KvDtype::F32, 1, 5, 1, 4, 2).unwrap());
        let a = filled(&pool, 20, 0.0); // 2 pages
        let mut b = filled(&pool, 40, 1000.0); // 3 pages
        assert_eq!(pool.free_pages(), 0);
        // A full pool is a typed error and changes nothing.
        let err = b.reserve(40, 50).unwrap_err();
        assert!(matches!(err, Error::KvFull(_)), "{err:?}");
        assert_eq!(b.pages_held(), 3);
        // Each sequence still reads its own rows.
        let t = ThreadPool::new(1);
        let ea = a.export(20, &t).unwrap();
        assert_eq!(
            f32::from_le_bytes(ea[4 * 4 * 17..4 * 4 * 17 + 4].try_into().unwrap()),
            68.0
        );
        b.truncate(17); // keeps 2 pages
        assert_eq!(pool.free_pages(), 1);
        drop(a);
        assert_eq!(pool.free_pages(), 3);
        drop(b);
        assert_eq!(pool.free_pages(), 5);
    }

    #[test]
    fn a_fork_shares_pages_until_either_side_writes() {
        let pool = Arc::new(KvPool::new(KvDtype::F16, 1, 8, 1, 4, 2).unwrap());
        let t = ThreadPool::new(1);
        let mut a = filled(&pool, 24, 0.0); // pages 0 and 1 (half full)
        let before = a.export(24, &t).unwrap();
        let mut b = a.fork(24).unwrap();
        assert_eq!(pool.free_pages(), 6, "a fork copies nothing");
        // b writes position 24 (inside the shared half-full page): copied first.
        b.reserve(24, 25).unwrap();
        b.store(0, 24, &[9.0, 9.0, 9.0, 9.0], &[9.0, 9.0]);
        assert_eq!(pool.free_pages(), 5);
        // a writes the same position differently; neither sees the other.
        a.reserve(24, 25).unwrap();
        a.store(0, 24, &[7.0, 7.0, 7.0, 7.0], &[7.0, 7.0]);
        let (ea, eb) = (a.export(25, &t).unwrap(), b.export(25, &t).unwrap());
        assert_eq!(&ea[..24 * 4 * 2], &before[..24 * 4 * 2]);
        assert_eq!(&eb[..24 * 4 * 2], &before[..24 * 4 * 2]);
        assert_ne!(ea, eb);
        // The full first page is still shared; dropping both frees all.
        drop(a);
        drop(b);
        assert_eq!(pool.free_pages(), 8);
    }
}
