//! Pages of KV memory shared by the sequences of one model.
//!
//! A page holds `PAGE` consecutive positions of every layer and KV head.
//! Sequences hold pages through their page tables (`KvCache`), growing one
//! page at a time from a free list. A page can be held by several
//! sequences at once (a common prompt prefix): it is then read-only, and a
//! sequence about to write into it first copies it (copy on write, in
//! `KvCache::reserve`). Reference counts and the free list sit behind one
//! mutex; page contents are read and written without locks, under that
//! ownership protocol:
//!
//! - only a page with a single holder is ever written, by that holder;
//! - a holder reads only its own pages, and pages are not recycled while
//!   held, so no page is written while someone else reads it.
//!
//! Layout per layer: `[page][kv_head][slot][dim]`, so one head's rows in a
//! page are contiguous (attention reads them as one tile).
//!
//! A pool whose shape says `v_in_k` (DeepSeek's MLA) stores keys only:
//! each value is the first `dim_v` elements of its key row, read from the
//! key store (`KvCache::values`), so the latent is held once.

use std::sync::Mutex;

use memmap2::MmapMut;

pub use super::kv_dtype::KvShape;
use super::kv_dtype::{KvDtype, KvRot, KvTypes};
use crate::ops::vec::f32_to_f16_bits;
use crate::quant::kv as kvq;
use crate::{Error, Result};

/// Positions per page.
pub const PAGE: usize = 16;

// Keys or values: declared beside the cache types, which are per side.
pub use super::kv_dtype::Side;

/// One layer's page memory (either side): an anonymous mapping, so the OS
/// commits a page of it only when it is first written (a pool sized for
/// many contexts costs the memory of the positions actually used, and an
/// engine's private pool costs nothing until it evaluates). The heap would
/// not promise that: a recycled `calloc` block is zeroed by hand, which
/// touches all of it. The pointer is taken once; the mapping never moves.
struct Store {
    map: Option<MmapMut>,
    data: Data,
    len: usize,
}

/// Mappings of dropped stores, kept for the next store of the same size
/// (oldest first), at most `SPARE_BYTES` of them (virtual size).
///
/// Why: a session restored into a new engine (`Engine.restore_bytes`, a
/// server adopting a saved session) writes its whole KV into a new pool,
/// and on a fresh anonymous mapping every 4 KiB of it is a page fault
/// that the kernel zeroes first: for 561 positions of SmolLM2 that was
/// most of the restore (an import into a pool already used took a sixth
/// of the time). A dropped engine's mappings are already faulted in, so
/// the next pool of that shape takes them. Their old rows are never read:
/// a pool hands out pages that earlier sequences wrote (the free list),
/// and readers only read positions their sequence wrote.
static SPARE: Mutex<Vec<MmapMut>> = Mutex::new(Vec::new());

/// The most virtual bytes of dropped mappings kept (`OXILLAMA_KV_SPARE_MB`,
/// default 512; 0 keeps none).
fn spare_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        std::env::var("OXILLAMA_KV_SPARE_MB")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(512)
            .saturating_mul(1 << 20)
    })
}

fn take_spare(bytes: usize) -> Option<MmapMut> {
    let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
    let i = spare.iter().position(|m| m.len() == bytes)?;
    Some(spare.remove(i))
}

impl Drop for Store {
    fn drop(&mut self) {
        let Some(map) = self.map.take() else { return };
        let limit = spare_bytes();
        if map.len() > limit {
            return;
        }
        let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
        let mut held: usize = spare.iter().map(|m| m.len()).sum();
        while held + map.len() > limit && !spare.is_empty() {
            held -= spare.remove(0).len();
        }
        spare.push(map);
    }
}

#[derive(Clone, Copy)]
enum Data {
    F16(*mut u16),
    F32(*mut f32),
    Q8_0(*mut u8),
    Q4_0(*mut u8),
}

impl Data {
    fn at(dtype: KvDtype, p: *mut u8) -> Self {
        match dtype {
            KvDtype::F16 => Data::F16(p.cast::<u16>()),
            KvDtype::F32 => Data::F32(p.cast::<f32>()),
            KvDtype::Q8_0 => Data::Q8_0(p),
            KvDtype::Q4_0 => Data::Q4_0(p),
        }
    }
}

impl Store {
    fn new(dtype: KvDtype, n: usize) -> Result<Self> {
        let bytes = n
            .checked_mul(dtype.unit())
            .ok_or_else(|| Error::invalid("a KV pool of this size does not fit in memory"))?;
        let bytes = bytes.max(1);
        if let Some(mut map) = take_spare(bytes) {
            let data = Data::at(dtype, map.as_mut_ptr());
            return Ok(Store {
                map: Some(map),
                data,
                len: n,
            });
        }
        let mut map = MmapMut::map_anon(bytes).map_err(|e| {
            Error::invalid(format!(
                "cannot reserve {bytes} bytes for the KV cache ({e}); use a smaller context_size"
            ))
        })?;
        // Advice only: a batched decode step reads every row of eight
        // sequences' caches, and huge pages spare it a TLB miss per 4 KiB.
        let _ = map.advise(memmap2::Advice::HugePage);
        let data = Data::at(dtype, map.as_mut_ptr());
        Ok(Store {
            map: Some(map),
            data,
            len: n,
        })
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// Rows of one head inside one page, as stored (quantized rows as their
/// blocks, back to back).
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    F16(&'a [u16]),
    F32(&'a [f32]),
    Q8_0(&'a [u8]),
    Q4_0(&'a [u8]),
}

impl<'a> Rows<'a> {
    /// `len` storage units from unit `at`.
    pub fn sub(&self, at: usize, len: usize) -> Rows<'a> {
        match *self {
            Rows::F16(x) => Rows::F16(&x[at..at + len]),
            Rows::F32(x) => Rows::F32(&x[at..at + len]),
            Rows::Q8_0(x) => Rows::Q8_0(&x[at..at + len]),
            Rows::Q4_0(x) => Rows::Q4_0(&x[at..at + len]),
        }
    }

    /// Asks for these rows' bytes to be fetched ahead of their use.
    pub fn prefetch(&self) {
        let (p, len) = match self {
            Rows::F16(x) => (x.as_ptr().cast::<u8>(), std::mem::size_of_val(*x)),
            Rows::F32(x) => (x.as_ptr().cast::<u8>(), std::mem::size_of_val(*x)),
            Rows::Q8_0(x) | Rows::Q4_0(x) => (x.as_ptr(), x.len()),
        };
        crate::simd::prefetch_bytes(p, len);
    }
}

struct Counts {
    free: Vec<u32>,
    refs: Vec<u32>,
}

pub struct KvPool {
    pub dtype: KvTypes,
    /// The rotation the rows of each side are stored under (the forward
    /// pass rotates before it stores; see `KvRot`).
    pub rot: KvRot,
    pub n_layer: usize,
    pub n_head_kv: usize,
    pub dim_k: usize,
    pub dim_v: usize,
    /// Values are read from the keys' rows (see the module comment).
    pub v_in_k: bool,
    pub n_pages: usize,
    k: Vec<Store>,
    v: Vec<Store>,
    counts: Mutex<Counts>,
}

// SAFETY: the raw pointers in `Store` point into mappings this pool owns
// for its whole life; concurrent access to page contents follows the ownership
// protocol in the module comment (writers hold a page alone), and the
// bookkeeping is behind a mutex.
unsafe impl Sync for KvPool {}
// SAFETY: as above; nothing in the pool is tied to a thread.
unsafe impl Send for KvPool {}

impl KvPool {
    /// A pool whose rows are rotated as llama.cpp's cache would be (its
    /// default for these types and head sizes, unless
    /// `OXILLAMA_ATTN_ROT_DISABLE` is set: `KvRot::from_env`).
    pub fn new(
        dtype: impl Into<KvTypes>,
        n_layer: usize,
        n_pages: usize,
        n_head_kv: usize,
        dim_k: usize,
        dim_v: usize,
    ) -> Result<Self> {
        Self::for_shape(
            dtype,
            KvShape::plain(n_layer, n_head_kv, dim_k, dim_v),
            n_pages,
        )
    }

    /// A pool for a model's `KvShape`. One that reads values from its keys
    /// holds them in f16 or f32, one type for both sides, unrotated: a
    /// quantized latent would need llama.cpp's rotation of MLA rows, which
    /// we do not reproduce, so it is refused naming the type.
    pub fn for_shape(dtype: impl Into<KvTypes>, shape: KvShape, n_pages: usize) -> Result<Self> {
        let dtype: KvTypes = dtype.into();
        if !shape.v_in_k {
            let rot = KvRot::from_env(dtype, shape.dim_k, shape.dim_v);
            return Self::with_rot(
                dtype,
                shape.n_layer,
                n_pages,
                shape.n_head_kv,
                shape.dim_k,
                shape.dim_v,
                rot,
            );
        }
        if dtype.k != dtype.v || dtype.k.is_quantized() {
            return Err(Error::invalid(format!(
                "KV cache type {:?} is not supported for a latent (MLA) cache: it holds one \
                 row per token, in f16 or f32",
                dtype.name()
            )));
        }
        if shape.dim_v > shape.dim_k {
            return Err(Error::invalid(format!(
                "values of {} elements cannot be read from key rows of {}",
                shape.dim_v, shape.dim_k
            )));
        }
        let mut pool = Self::with_rot(
            dtype,
            shape.n_layer,
            n_pages,
            shape.n_head_kv,
            shape.dim_k,
            0,
            KvRot::NONE,
        )?;
        pool.dim_v = shape.dim_v;
        pool.v_in_k = true;
        Ok(pool)
    }

    /// The shape this pool was made for.
    pub fn shape(&self) -> KvShape {
        KvShape {
            n_layer: self.n_layer,
            n_head_kv: self.n_head_kv,
            dim_k: self.dim_k,
            dim_v: self.dim_v,
            v_in_k: self.v_in_k,
        }
    }

    /// A pool whose rows are stored under rotation `rot`.
    pub fn with_rot(
        dtype: impl Into<KvTypes>,
        n_layer: usize,
        n_pages: usize,
        n_head_kv: usize,
        dim_k: usize,
        dim_v: usize,
        rot: KvRot,
    ) -> Result<Self> {
        if n_pages == 0 || n_pages > u32::MAX as usize {
            return Err(Error::invalid(format!(
                "a KV pool needs 1 to {} pages, got {n_pages}",
                u32::MAX
            )));
        }
        let dtype: KvTypes = dtype.into();
        dtype.k.check_dim(dim_k)?;
        dtype.v.check_dim(dim_v)?;
        rot.check(dim_k, dim_v)?;
        let elems = |dim: usize| {
            n_pages
                .checked_mul(n_head_kv)
                .and_then(|x| x.checked_mul(PAGE))
                .and_then(|x| x.checked_mul(dim))
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "a KV pool of {n_pages} pages does not fit in memory"
                    ))
                })
        };
        let (ek, ev) = (
            elems(dtype.k.row_units(dim_k))?,
            elems(dtype.v.row_units(dim_v))?,
        );
        let k = (0..n_layer)
            .map(|_| Store::new(dtype.k, ek))
            .collect::<Result<_>>()?;
        let v = (0..n_layer)
            .map(|_| Store::new(dtype.v, ev))
            .collect::<Result<_>>()?;
        Ok(KvPool {
            dtype,
            rot,
            n_layer,
            n_head_kv,
            dim_k,
            dim_v,
            v_in_k: false,
            n_pages,
            k,
            v,
            counts: Mutex::new(Counts {
                // Popped from the end: hand out low page numbers first.
                free: (0..n_pages as u32).rev().collect(),
                refs: vec![0; n_pages],
            }),
        })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh page held once, or `None` when the pool is exhausted.
    pub fn alloc(&self) -> Option<u32> {
        let mut c = self.counts();
        let p = c.free.pop()?;
        c.refs[p as usize] = 1;
        Some(p)
    }

    /// One more holder of page `p`.
    pub fn retain(&self, p: u32) {
        self.counts().refs[p as usize] += 1;
    }

    /// One holder fewer; the page returns to the free list with the last.
    pub fn release(&self, p: u32) {
        let mut c = self.counts();
        let r = &mut c.refs[p as usize];
        debug_assert!(*r > 0, "page {p} released more often than held");
        *r = r.saturating_sub(1);
        if *r == 0 {
            c.free.push(p);
        }
    }

    /// Whether page `p` has other holders than the caller.
    pub fn shared(&self, p: u32) -> bool {
        self.counts().refs[p as usize] > 1
    }

    pub fn free_pages(&self) -> usize {
        self.counts().free.len()
    }

    /// Elements of one stored row (none on the value side of a pool that
    /// reads values from its keys).
    fn dim(&self, side: Side) -> usize {
        match side {
            Side::K => self.dim_k,
            Side::V if self.v_in_k => 0,
            Side::V => self.dim_v,
        }
    }

    /// The sides that hold rows.
    pub fn stored_sides(&self) -> &'static [Side] {
        if self.v_in_k {
            &[Side::K]
        } else {
            &[Side::K, Side::V]
        }
    }

    /// Storage units of a row's first `dim` elements on `side` (a value
    /// read from a key row).
    pub fn prefix_units(&self, side: Side, dim: usize) -> usize {
        self.dtype.side(side).row_units(dim)
    }

    /// Storage units of one stored row on `side`.
    pub fn row_units(&self, side: Side) -> usize {
        self.units(side)
    }

    /// Storage units (elements, or bytes of quantized blocks) of one row.
    fn units(&self, side: Side) -> usize {
        self.dtype.side(side).row_units(self.dim(side))
    }

    fn store(&self, layer: usize, side: Side) -> &Store {
        match side {
            Side::K => &self.k[layer],
            Side::V => &self.v[layer],
        }
    }

    /// Unit offset of `(page, head, slot)` on one side.
    fn offset(&self, side: Side, page: u32, head: usize, slot: usize) -> usize {
        ((page as usize * self.n_head_kv + head) * PAGE + slot) * self.units(side)
    }

    /// Writes one position's row of one head.
    ///
    /// # Safety
    /// The caller holds `page` alone (see the module comment), and nobody
    /// reads this row concurrently.
    pub unsafe fn write_row(
        &self,
        layer: usize,
        side: Side,
        page: u32,
        head: usize,
        slot: usize,
        src: &[f32],
    ) {
        assert_eq!(src.len(), self.dim(side), "KV row of the wrong width");
        // SAFETY: forwarded from the caller.
        match unsafe { self.rows_mut(layer, side, page, head, slot, slot + 1) } {
            RowsMut::F16(dst) => f32_to_f16_bits(src, dst),
            RowsMut::F32(dst) => dst.copy_from_slice(src),
            RowsMut::Q8_0(dst) => kvq::quantize_q8_0(src, dst),
            RowsMut::Q4_0(dst) => kvq::quantize_q4_0(src, dst),
        }
    }

    /// Element offset and length of rows `slot0..slot1` of one head in one
    /// page, checked against the pool's bounds.
    fn span(
        &self,
        side: Side,
        page: u32,
        head: usize,
        slot0: usize,
        slot1: usize,
    ) -> (usize, usize) {
        assert!(
            (page as usize) < self.n_pages
                && head < self.n_head_kv
                && slot0 <= slot1
                && slot1 <= PAGE,
            "KV rows out of range"
        );
        (
            self.offset(side, page, head, slot0),
            (slot1 - slot0) * self.units(side),
        )
    }

    /// Rows `slot0..slot1` of one head in one page.
    ///
    /// # Safety
    /// The caller holds `page`, so it is not written while the returned
    /// rows live.
    pub unsafe fn rows(
        &self,
        layer: usize,
        side: Side,
        page: u32,
        head: usize,
        slot0: usize,
        slot1: usize,
    ) -> Rows<'_> {
        let (at, n) = self.span(side, page, head, slot0, slot1);
        match self.store(layer, side).data {
            // SAFETY: in bounds (`span` checks); no concurrent writer per
            // the caller's contract.
            Data::F16(p) => Rows::F16(unsafe { std::slice::from_raw_parts(p.add(at), n) }),
            // SAFETY: as above.
            Data::F32(p) => Rows::F32(unsafe { std::slice::from_raw_parts(p.add(at), n) }),
            // SAFETY: as above.
            Data::Q8_0(p) => Rows::Q8_0(unsafe { std::slice::from_raw_parts(p.add(at), n) }),
            // SAFETY: as above.
            Data::Q4_0(p) => Rows::Q4_0(unsafe { std::slice::from_raw_parts(p.add(at), n) }),
        }
    }

    /// Mutable rows `slot0..slot1` of one head in one page.
    ///
    /// # Safety
    /// The caller holds `page` alone and nobody reads it concurrently.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn rows_mut(
        &self,
        layer: usize,
        side: Side,
        page: u32,
        head: usize,
        slot0: usize,
        slot1: usize,
    ) -> RowsMut<'_> {
        let (at, n) = self.span(side, page, head, slot0, slot1);
        match self.store(layer, side).data {
            // SAFETY: in bounds (`span` checks); exclusive per the contract.
            Data::F16(p) => RowsMut::F16(unsafe { std::slice::from_raw_parts_mut(p.add(at), n) }),
            // SAFETY: as above.
            Data::F32(p) => RowsMut::F32(unsafe { std::slice::from_raw_parts_mut(p.add(at), n) }),
            // SAFETY: as above.
            Data::Q8_0(p) => RowsMut::Q8_0(unsafe { std::slice::from_raw_parts_mut(p.add(at), n) }),
            // SAFETY: as above.
            Data::Q4_0(p) => RowsMut::Q4_0(unsafe { std::slice::from_raw_parts_mut(p.add(at), n) }),
        }
    }

    /// Copies every layer and head of page `from` into page `to`.
    ///
    /// # Safety
    /// The caller holds `to` alone and holds `from` (so nobody writes it).
    pub unsafe fn copy_page(&self, from: u32, to: u32) {
        for layer in 0..self.n_layer {
            for &side in self.stored_sides() {
                for h in 0..self.n_head_kv {
                    // SAFETY: per the caller's contract.
                    let (src, dst) = unsafe {
                        (
                            self.rows(layer, side, from, h, 0, PAGE),
                            self.rows_mut(layer, side, to, h, 0, PAGE),
                        )
                    };
                    match (src, dst) {
                        (Rows::F16(s), RowsMut::F16(d)) => d.copy_from_slice(s),
                        (Rows::F32(s), RowsMut::F32(d)) => d.copy_from_slice(s),
                        (Rows::Q8_0(s), RowsMut::Q8_0(d)) | (Rows::Q4_0(s), RowsMut::Q4_0(d)) => {
                            d.copy_from_slice(s)
                        }
                        _ => unreachable!("a side of a pool has one dtype"),
                    }
                }
            }
        }
    }

    /// Bytes of page memory (both sides, every layer).
    pub fn bytes(&self) -> usize {
        self.k.iter().map(Store::len).sum::<usize>() * self.dtype.k.unit()
            + self.v.iter().map(Store::len).sum::<usize>() * self.dtype.v.unit()
    }
}

pub enum RowsMut<'a> {
    F16(&'a mut [u16]),
    F32(&'a mut [f32]),
    Q8_0(&'a mut [u8]),
    Q4_0(&'a mut [u8]),
}
