//! The memory-budgeted layer pager: runs a model whose weights need not
//! all stay in memory. The forward pass calls it before each layer and
//! each slice of the output head; it maps that unit's pages in from the
//! file (they are the only copy: the file's own page cache pages, mapped
//! read-only), starts reading the next unit while the current one
//! computes, and unmaps and drops the least recently used units once the
//! resident ones would pass the budget. Pinned units are mapped once and
//! never dropped.
//!
//! One pager serves every session of a model; a forward pass holds its
//! lock from the first layer to the head, so passes on a budgeted model
//! run one at a time (they would share the one thread pool anyway) and the
//! budget holds whatever the number of sessions.

use std::sync::{Arc, Mutex, MutexGuard};

use super::weights::MatRef;
use crate::gguf::{page_size, GgufFile, Paging};
use crate::{Error, Result};

/// Which unit leaves when the budget is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evict {
    /// The least recently used. Under a budget smaller than the model a
    /// forward pass, which walks the units in one fixed order, finds every
    /// unpinned unit evicted before it comes round again.
    Lru,
    /// The one whose next use lies furthest ahead in that fixed order
    /// (Belady's choice for a repeating walk): the unit just used, so the
    /// ones at the start of the next pass stay. Each pass then reads about
    /// the model minus the budget instead of the whole model.
    Furthest,
}

impl Evict {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "lru" => Ok(Evict::Lru),
            "furthest" => Ok(Evict::Furthest),
            _ => Err(Error::invalid(format!(
                "offload: unknown eviction order {s:?} (known: \"lru\", \"furthest\")"
            ))),
        }
    }
}

/// What `Engine(offload=...)` asks for, in bytes and unit choices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffloadSpec {
    pub budget: usize,
    pub pin_layers: Vec<usize>,
    pub pin_embeddings: bool,
    pub pin_output: bool,
    pub evict: Evict,
}

/// Counters since the pager was built (pinned loads included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PagerStats {
    pub budget: usize,
    pub pinned_bytes: usize,
    pub resident_bytes: usize,
    pub peak_resident_bytes: usize,
    /// Units paged in (read ahead or on demand).
    pub loads: u64,
    pub evictions: u64,
    /// Bytes paged in from the file: whole units, plus the pages of
    /// embedding rows looked up outside resident units.
    pub bytes_read: u64,
    /// Forward passes that went through the pager.
    pub passes: u64,
}

/// A pageable piece of the weights: one layer's tensors or a slice of rows
/// of the output head, as page-aligned byte ranges of the file.
struct Unit {
    name: String,
    ranges: Vec<(usize, usize)>,
    bytes: usize,
    pinned: bool,
}

struct State {
    /// Counted against the budget: mapped, or being read ahead.
    resident: Vec<bool>,
    /// Mapped into this process (a read-ahead unit is resident, not yet
    /// populated).
    populated: Vec<bool>,
    last_use: Vec<u64>,
    clock: u64,
    stats: PagerStats,
}

pub struct LayerPager {
    file: Arc<GgufFile>,
    spec: OffloadSpec,
    units: Vec<Unit>,
    n_layer: usize,
    /// Output-head rows per head unit (a multiple of 256, or all of them).
    head_rows: usize,
    n_head_units: usize,
    page: usize,
    state: Mutex<State>,
}

/// Head slices are a multiple of 256 rows, so every kernel tile is whole.
const HEAD_ROW_ALIGN: usize = 256;
/// The largest page-cache folio a file is cached in (a PMD on x86-64 and
/// arm64 with 4 KiB pages).
const FOLIO: usize = 2 << 20;
/// Slice size for a model without layers.
const HEAD_SLICE_DEFAULT: usize = 4 << 20;

impl LayerPager {
    pub fn new(
        file: Arc<GgufFile>,
        n_layer: usize,
        output: &MatRef,
        spec: OffloadSpec,
    ) -> Result<Self> {
        if !file.is_mapped() {
            return Err(Error::invalid(
                "offload needs a model mapped from a file; this one was loaded from bytes",
            ));
        }
        if let Some(&bad) = spec.pin_layers.iter().find(|&&l| l >= n_layer) {
            return Err(Error::invalid(format!(
                "offload: cannot pin layer {bad}, the model has {n_layer} layers (0..{})",
                n_layer.saturating_sub(1)
            )));
        }
        let page = page_size();
        let len = file.file_size();
        let mut per_layer: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n_layer];
        for t in file.tensors() {
            if let Some(il) = layer_of(&t.name).filter(|&il| il < n_layer) {
                per_layer[il].push((t.offset, t.offset + t.nbytes));
            }
        }
        let mut units: Vec<Unit> = per_layer
            .into_iter()
            .enumerate()
            .map(|(il, r)| Unit::new(format!("layer {il}"), r, page, len, false))
            .collect();
        for &il in &spec.pin_layers {
            units[il].pinned = true;
        }
        let largest_layer = units.iter().map(|u| u.bytes).max().unwrap_or(0);
        let row_bytes = output.nbytes / output.rows.max(1);
        let tied = output_is_embedding(&file, output);
        // The head is the embedding matrix when the two are tied, so pinning
        // the embeddings pins it too. An untied embedding is only read a row
        // per token and becomes a unit only when pinned.
        let pin_head = spec.pin_output || (spec.pin_embeddings && tied);
        let pinned_embd = match file.tensor("token_embd.weight") {
            Some(t) if spec.pin_embeddings && !tied => t.nbytes + 2 * page,
            _ => 0,
        };
        let pinned_layers: usize = units.iter().filter(|u| u.pinned).map(|u| u.bytes).sum();
        // Head slices as large as a quarter of what the budget leaves beside
        // the pinned units, never below the largest layer: every slice is
        // one more pool dispatch per token, which on a busy machine costs
        // far more than its arithmetic (47 slices of 3.8 MiB made Gemma-3's
        // decode 30% slower with every unit resident).
        let slice = if pin_head {
            output.nbytes
        } else {
            let free = spec.budget.saturating_sub(pinned_layers + pinned_embd);
            let floor = if largest_layer > 0 {
                largest_layer
            } else {
                HEAD_SLICE_DEFAULT
            };
            (free / 4).max(floor)
        };
        let head_rows = (slice / row_bytes.max(1) / HEAD_ROW_ALIGN * HEAD_ROW_ALIGN)
            .max(HEAD_ROW_ALIGN)
            .min(output.rows.max(1));
        let n_head_units = output.rows.div_ceil(head_rows);
        for c in 0..n_head_units {
            let r0 = c * head_rows;
            let r1 = (r0 + head_rows).min(output.rows);
            let start = output.offset + r0 * row_bytes;
            let end = output.offset + r1 * row_bytes;
            units.push(Unit::new(
                format!("output rows {r0}..{r1}"),
                vec![(start, end)],
                page,
                len,
                pin_head,
            ));
        }
        if spec.pin_embeddings && !tied {
            if let Some(t) = file.tensor("token_embd.weight") {
                let r = vec![(t.offset, t.offset + t.nbytes)];
                units.push(Unit::new("token_embd".into(), r, page, len, true));
            }
        }
        let pinned: usize = units.iter().filter(|u| u.pinned).map(|u| u.bytes).sum();
        let largest = units.iter().filter(|u| !u.pinned).max_by_key(|u| u.bytes);
        let need = pinned + largest.map_or(0, |u| u.bytes);
        if spec.budget < need {
            let what = match largest {
                Some(u) => format!(
                    " plus the largest unit it pages ({}, {} bytes)",
                    u.name, u.bytes
                ),
                None => String::new(),
            };
            return Err(Error::invalid(format!(
                "offload budget of {} bytes is too small: the pinned set ({pinned} bytes){what} needs {need} bytes",
                spec.budget
            )));
        }
        let n = units.len();
        let pager = LayerPager {
            file,
            units,
            n_layer,
            head_rows,
            n_head_units,
            page,
            state: Mutex::new(State {
                resident: vec![false; n],
                populated: vec![false; n],
                last_use: vec![0; n],
                clock: 0,
                stats: PagerStats {
                    budget: spec.budget,
                    pinned_bytes: pinned,
                    ..PagerStats::default()
                },
            }),
            spec,
        };
        pager.start()?;
        Ok(pager)
    }

    pub fn spec(&self) -> &OffloadSpec {
        &self.spec
    }

    pub fn stats(&self) -> PagerStats {
        self.lock().stats
    }

    /// Rows per output-head slice and the number of slices.
    pub fn head_slices(&self) -> (usize, usize) {
        (self.head_rows, self.n_head_units)
    }

    /// Takes the pager for one forward pass.
    pub fn begin(&self) -> PagerPass<'_> {
        let mut st = self.lock();
        st.stats.passes += 1;
        PagerPass { pager: self, st }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic mid-pass leaves the state consistent enough: at worst a
        // unit counted resident is not mapped, and the next enter maps it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops whatever loading the file left mapped or cached (header,
    /// vectors read at load, the open-time read-ahead), then maps the
    /// pinned units: from here on, resident weights are what this pager
    /// made resident.
    fn start(&self) -> Result<()> {
        let len = self.file.file_size();
        self.io(0, len, Paging::Random)?;
        self.io(0, len, Paging::Unmap)?;
        self.io(0, len, Paging::DropCache)?;
        let mut st = self.lock();
        for u in 0..self.units.len() {
            if self.units[u].pinned {
                self.load(&mut st, u, true)?;
            }
        }
        Ok(())
    }

    fn io(&self, offset: usize, len: usize, what: Paging) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.file.page(offset, len, what).map_err(|e| {
            Error::load(format!(
                "offload: paging the model file failed ({what:?} of {len} bytes at {offset}): {e}"
            ))
        })
    }

    fn load(&self, st: &mut State, u: usize, populate: bool) -> Result<()> {
        // Explicit read-ahead even when the unit is needed now: large
        // sequential reads, in folios that never straddle into a neighbour.
        for &(a, b) in &self.units[u].ranges {
            self.io(a, b - a, Paging::Prefetch)?;
        }
        if populate {
            for &(a, b) in &self.units[u].ranges {
                self.io(a, b - a, Paging::Populate)?;
            }
        }
        st.resident[u] = true;
        st.populated[u] = populate;
        st.stats.loads += 1;
        st.stats.bytes_read += self.units[u].bytes as u64;
        st.stats.resident_bytes += self.units[u].bytes;
        st.stats.peak_resident_bytes = st.stats.peak_resident_bytes.max(st.stats.resident_bytes);
        Ok(())
    }

    /// Whether file page `p` (an index) belongs to a resident unit other
    /// than `except`; such pages are never dropped.
    fn page_held(&self, st: &State, p: usize, except: Option<usize>) -> bool {
        let at = p * self.page;
        self.units.iter().enumerate().any(|(w, unit)| {
            Some(w) != except
                && st.resident[w]
                && unit.ranges.iter().any(|&(a, b)| a <= at && at < b)
        })
    }

    /// Unmaps and drops bytes `a..b` (page-aligned) except the pages at
    /// either end that a resident unit shares.
    fn release(&self, st: &State, a: usize, b: usize, except: Option<usize>) -> Result<usize> {
        let (mut p0, mut p1) = (a / self.page, b.div_ceil(self.page));
        while p0 < p1 && self.page_held(st, p0, except) {
            p0 += 1;
        }
        while p1 > p0 && self.page_held(st, p1 - 1, except) {
            p1 -= 1;
        }
        if p0 == p1 {
            return Ok(0);
        }
        let start = p0 * self.page;
        let end = (p1 * self.page).min(self.file.file_size());
        self.io(start, end - start, Paging::Unmap)?;
        self.drop_cache(st, start, end)?;
        Ok(end - start)
    }

    /// Drops `a..b` from the page cache, widened to whole folios: the page
    /// cache holds files in large folios (up to `FOLIO`), and one that
    /// straddles a unit's edge survives a drop of the unit's own range
    /// (measured on Gemma-3 at 25%: 74 MiB of the file stayed cached beyond
    /// the budget). Mapped pages are never dropped, so the widening spares
    /// every populated unit; it stops short of units being read ahead,
    /// which are cached but not yet mapped.
    fn drop_cache(&self, st: &State, a: usize, b: usize) -> Result<()> {
        let len = self.file.file_size();
        let mut lo = a / FOLIO * FOLIO;
        let mut hi = (b.div_ceil(FOLIO) * FOLIO).min(len);
        for (w, unit) in self.units.iter().enumerate() {
            if !st.resident[w] || st.populated[w] {
                continue;
            }
            for &(ra, rb) in &unit.ranges {
                if rb <= a && rb > lo {
                    lo = rb;
                }
                if ra >= b && ra < hi {
                    hi = ra;
                }
            }
        }
        self.io(lo, hi.max(lo) - lo, Paging::DropCache)
    }

    fn evict(&self, st: &mut State, u: usize) -> Result<()> {
        st.resident[u] = false;
        st.populated[u] = false;
        st.stats.resident_bytes -= self.units[u].bytes;
        st.stats.evictions += 1;
        for &(a, b) in &self.units[u].ranges {
            self.release(st, a, b, Some(u))?;
        }
        Ok(())
    }

    /// Evicts unpinned units (never `keep`, the unit being entered), in
    /// the spec's order, until `need` more bytes fit; false when they
    /// cannot.
    fn make_room(&self, st: &mut State, need: usize, keep: usize) -> Result<bool> {
        let cycle = self.n_layer + self.n_head_units;
        while st.stats.resident_bytes + need > self.spec.budget {
            let candidates = (0..self.units.len())
                .filter(|&w| w != keep && st.resident[w] && !self.units[w].pinned);
            let victim = match self.spec.evict {
                Evict::Lru => candidates.min_by_key(|&w| st.last_use[w]),
                Evict::Furthest => candidates.max_by_key(|&w| (w + cycle - keep) % cycle),
            };
            match victim {
                Some(w) => self.evict(st, w)?,
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// The unit a pass reaches after `u`: the layers, the head slices,
    /// then the next pass's first layer.
    fn next_of(&self, u: usize) -> usize {
        if u + 1 < self.n_layer + self.n_head_units {
            u + 1
        } else {
            0
        }
    }
}

/// The pager held by one forward pass.
pub struct PagerPass<'a> {
    pager: &'a LayerPager,
    st: MutexGuard<'a, State>,
}

impl PagerPass<'_> {
    /// Rows per output-head slice and the number of slices.
    pub fn head_slices(&self) -> (usize, usize) {
        self.pager.head_slices()
    }

    /// Before layer `il` runs.
    pub fn enter_layer(&mut self, il: usize) -> Result<()> {
        self.enter(il)
    }

    /// Before output-head slice `c` is multiplied.
    pub fn enter_head(&mut self, c: usize) -> Result<()> {
        self.enter(self.pager.n_layer + c)
    }

    fn enter(&mut self, u: usize) -> Result<()> {
        let pg = self.pager;
        let st = &mut *self.st;
        st.clock += 1;
        st.last_use[u] = st.clock;
        if !st.resident[u] {
            if !pg.make_room(st, pg.units[u].bytes, u)? {
                return Err(Error::internal(format!(
                    "offload: no room for {} although the budget was checked",
                    pg.units[u].name
                )));
            }
            pg.load(st, u, true)?;
        } else if !st.populated[u] {
            for &(a, b) in &pg.units[u].ranges {
                pg.io(a, b - a, Paging::Populate)?;
            }
            st.populated[u] = true;
        }
        // Read the next unit ahead while this one computes, if it fits
        // without evicting this one.
        let v = pg.next_of(u);
        if v != u && !st.resident[v] && pg.make_room(st, pg.units[v].bytes, u)? {
            pg.load(st, v, false)?;
            st.last_use[v] = st.clock;
        }
        Ok(())
    }

    /// After an embedding row at bytes `a..b` of the file was read: its
    /// pages are dropped again unless a resident unit holds them.
    pub fn after_row(&mut self, a: usize, b: usize) -> Result<()> {
        let pg = self.pager;
        let st = &mut *self.st;
        let (a, b) = (a / pg.page * pg.page, b.div_ceil(pg.page) * pg.page);
        let dropped = pg.release(st, a, b.min(pg.file.file_size()), None)?;
        st.stats.bytes_read += dropped as u64;
        Ok(())
    }
}

impl Unit {
    fn new(
        name: String,
        mut ranges: Vec<(usize, usize)>,
        page: usize,
        len: usize,
        pinned: bool,
    ) -> Self {
        ranges.retain(|&(a, b)| b > a);
        for r in &mut ranges {
            *r = (r.0 / page * page, (r.1.div_ceil(page) * page).min(len));
        }
        ranges.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
        for (a, b) in ranges {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        let bytes = merged.iter().map(|&(a, b)| b - a).sum();
        Unit {
            name,
            ranges: merged,
            bytes,
            pinned,
        }
    }
}

/// `blk.{il}.…` names layer `il`.
fn layer_of(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("blk.")?;
    let (n, _) = rest.split_once('.')?;
    n.parse().ok()
}

fn output_is_embedding(file: &GgufFile, output: &MatRef) -> bool {
    file.tensor("token_embd.weight")
        .is_some_and(|t| t.offset == output.offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_names() {
        assert_eq!(layer_of("blk.12.attn_q.weight"), Some(12));
        assert_eq!(layer_of("blk.x.attn_q.weight"), None);
        assert_eq!(layer_of("output.weight"), None);
        assert_eq!(layer_of("blk.3"), None);
    }

    #[test]
    fn units_round_out_and_merge() {
        let u = Unit::new(
            "u".into(),
            vec![(5000, 6000), (100, 200), (8100, 9000), (7000, 7000)],
            4096,
            8500,
            false,
        );
        assert_eq!(u.ranges, vec![(0, 8500)]);
        assert_eq!(u.bytes, 8500);
        let v = Unit::new(
            "v".into(),
            vec![(0, 10), (9000, 9001)],
            4096,
            1 << 20,
            false,
        );
        assert_eq!(v.ranges, vec![(0, 4096), (8192, 12288)]);
    }
}
