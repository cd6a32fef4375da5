//! One arena, on transparent huge pages where the kernel gives them, for
//! every matrix decode streams: the layouts the kernels repack, and copies
//! of the file's bytes for the formats they read as stored.
//!
//! Why: decode reads every such matrix once per token, and on 4 KiB pages
//! each 4 KiB costs a TLB miss and stops the hardware prefetcher at the
//! page's edge. A mapping per matrix (2-3 MB each on a 1-8B model) is
//! rarely 2 MiB-aligned, so only part of it could be huge: the synthetic
//! SmolLM2-1.7B had 489 of its 827 MB of packed weights on huge pages that
//! way. The file's own pages are huge only when the page cache happens to
//! hold them in 2 MiB folios (it did for one of our files and not for
//! another), so the matrices read as stored are copied too. One mapping,
//! aligned to 2 MiB by hand, is huge-paged end to end.
//!
//! Once made, the arena moves into a file that the user's other processes
//! running the same model map too (`shared_arena`); a process that finds
//! that file maps it instead of making its own.

use std::collections::HashMap;
use std::ops::Range;

use memmap2::MmapMut;

use super::shared_arena::{self, Published, SharedMap};

/// The size of a transparent huge page on x86-64 and most arm64 kernels;
/// only alignment and advice depend on it, never correctness.
const HUGE: usize = 2 << 20;
/// Each matrix starts on a page of its own (few hundred matrices, so the
/// padding is small against the arena).
const START_ALIGN: usize = 4096;

/// What the arena holds for a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// A decode layout the kernels derived (`quant::pack_matrix_into`).
    Packed,
    /// The file's bytes, unchanged.
    Copy,
}

/// Matrices by the data offset of the tensor they come from.
#[derive(Default)]
pub struct WeightArena {
    memory: Memory,
    /// Each matrix's bytes in `memory`.
    spans: HashMap<usize, (Range<usize>, Held)>,
    /// Where the arena starts in `memory`, and its length (whole huge pages).
    base: usize,
    total: usize,
}

#[derive(Default)]
enum Memory {
    #[default]
    None,
    /// This process's own, being filled or kept.
    Private(MmapMut),
    /// A file the user's processes that run this model all map.
    Shared(SharedMap),
}

impl Memory {
    fn bytes(&self) -> Option<&[u8]> {
        match self {
            Memory::None => None,
            Memory::Private(m) => Some(m),
            Memory::Shared(s) => Some(s.bytes()),
        }
    }
}

/// Each matrix's span from the arena's start, and the arena's length
/// (whole huge pages), for `wanted` in order; None on overflow.
type Layout = (Vec<(usize, Range<usize>, Held)>, usize);

fn layout(wanted: &[(usize, usize, Held)]) -> Option<Layout> {
    let mut spans = Vec::with_capacity(wanted.len());
    let mut end = 0usize;
    for &(offset, len, held) in wanted {
        let start = end.checked_next_multiple_of(START_ALIGN)?;
        end = start.checked_add(len)?;
        spans.push((offset, start..end, held));
    }
    Some((spans, end.checked_next_multiple_of(HUGE)?))
}

/// Where the shared arena of one model and layout lives: its folder and
/// its name (`shared_arena`), found once per load and used both to look
/// for the file and to publish it.
pub struct SharedPlace {
    dir: std::path::PathBuf,
    name: String,
}

impl SharedPlace {
    /// The place of the arena for `wanted` of the model in `model`; None
    /// when something its name depends on cannot be told.
    pub fn of(model: &std::fs::File, wanted: &[(usize, usize, Held)]) -> Option<Self> {
        let key: Vec<(usize, usize, u8)> = wanted
            .iter()
            .map(|&(o, n, h)| (o, n, matches!(h, Held::Copy) as u8))
            .collect();
        Some(SharedPlace {
            dir: shared_arena::arena_dir()?,
            name: shared_arena::arena_name(model, &key)?,
        })
    }
}

impl WeightArena {
    /// Reserves zeroed room for each `(tensor offset, bytes, what)` of
    /// `wanted`, advised to use huge pages. None when the memory cannot be
    /// mapped (the matrices then stay where the file has them).
    pub fn reserve(wanted: &[(usize, usize, Held)]) -> Option<Self> {
        let (spans, total) = layout(wanted)?;
        if total == 0 {
            return Some(Self::default());
        }
        // One huge page more than needed, so the arena can start on a
        // 2 MiB boundary wherever the kernel places the mapping.
        let map = MmapMut::map_anon(total.checked_add(HUGE)?).ok()?;
        let base = (map.as_ptr() as usize).next_multiple_of(HUGE) - map.as_ptr() as usize;
        // Advice only: without huge pages the layout is the same.
        let _ = map.advise_range(memmap2::Advice::HugePage, base, total);
        Some(WeightArena {
            memory: Memory::Private(map),
            spans: spans
                .into_iter()
                .map(|(o, r, h)| (o, (r.start + base..r.end + base, h)))
                .collect(),
            base,
            total,
        })
    }

    /// The arena for `wanted` that another process running the model
    /// shares at `place`, if there is one; nothing to fill.
    pub fn open_shared(place: &SharedPlace, wanted: &[(usize, usize, Held)]) -> Option<Self> {
        let (spans, total) = layout(wanted)?;
        let map = shared_arena::open(&place.dir, &place.name, total)?;
        Some(WeightArena {
            memory: Memory::Shared(map),
            spans: spans.into_iter().map(|(o, r, h)| (o, (r, h))).collect(),
            base: 0,
            total,
        })
    }

    /// Moves a filled arena for `wanted` into the file at `place`, which
    /// the user's other processes that run the model can map; only when
    /// every matrix was made (none forgotten), and the arena stays private
    /// if that fails. Returns whether it moved.
    pub fn share(&mut self, place: &SharedPlace, wanted: &[(usize, usize, Held)]) -> bool {
        let Memory::Private(map) = &mut self.memory else {
            return false;
        };
        if self.spans.len() != wanted.len() || self.total == 0 {
            return false;
        }
        let bytes = &mut map[self.base..self.base + self.total];
        match shared_arena::publish(&place.dir, &place.name, bytes) {
            Published::Shared(shared) => {
                let base = self.base;
                for (span, _) in self.spans.values_mut() {
                    *span = span.start - base..span.end - base;
                }
                self.base = 0;
                self.memory = Memory::Shared(shared);
                true
            }
            Published::Kept => false,
            // The matrices are then read where the file has them.
            Published::Lost => {
                *self = Self::default();
                false
            }
        }
    }

    /// Whether the arena's memory is a file other processes may share.
    pub fn is_shared(&self) -> bool {
        matches!(self.memory, Memory::Shared(_))
    }

    /// Each reserved span's bytes, writable, by tensor offset; disjoint,
    /// so they can be filled in parallel.
    pub fn parts_mut(&mut self) -> Vec<(usize, &mut [u8])> {
        let Memory::Private(map) = &mut self.memory else {
            return Vec::new();
        };
        let mut order: Vec<(usize, Range<usize>)> = self
            .spans
            .iter()
            .map(|(&o, (r, _))| (o, r.clone()))
            .collect();
        order.sort_by_key(|(_, r)| r.start);
        let mut rest: &mut [u8] = &mut map[..];
        let mut at = 0;
        let mut parts = Vec::with_capacity(order.len());
        for (offset, r) in order {
            let tail = std::mem::take(&mut rest).split_at_mut(r.start - at).1;
            let (part, after) = tail.split_at_mut(r.len());
            parts.push((offset, part));
            rest = after;
            at = r.end;
        }
        parts
    }

    /// Drops what the arena holds for one tensor (its filling failed):
    /// views then read the file.
    pub fn forget(&mut self, offset: usize) {
        self.spans.remove(&offset);
    }

    /// What the arena holds of the tensor whose data starts at `offset`,
    /// and its bytes.
    pub fn lookup(&self, offset: usize) -> Option<(Held, &[u8])> {
        let (r, h) = self.spans.get(&offset)?;
        Some((*h, &self.memory.bytes()?[r.clone()]))
    }

    /// What the arena holds of the tensor whose data starts at `offset`,
    /// if it is `held`.
    pub fn get(&self, offset: usize, held: Held) -> Option<&[u8]> {
        self.lookup(offset)
            .filter(|(h, _)| *h == held)
            .map(|(_, b)| b)
    }

    /// Whether `bytes` lie inside the arena's memory.
    pub fn holds(&self, bytes: &[u8]) -> bool {
        self.memory.bytes().is_some_and(|m| within(m, bytes))
    }

    /// The tensors the arena holds, with what it holds of each.
    pub fn held(&self) -> impl Iterator<Item = (usize, Held)> + '_ {
        self.spans.iter().map(|(&o, (_, h))| (o, *h))
    }
}

/// Whether `inner` lies inside `outer` (by address).
pub(crate) fn within(outer: &[u8], inner: &[u8]) -> bool {
    let (o, i) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
    i >= o && i.saturating_add(inner.len()) <= o + outer.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_disjoint_and_found_by_offset() {
        let (pk, cp) = (Held::Packed, Held::Copy);
        let mut p = WeightArena::reserve(&[(100, 5000, pk), (7, 3, cp), (9000, 1, pk)]).unwrap();
        for (o, part) in p.parts_mut() {
            part.fill((o % 251) as u8);
        }
        assert_eq!(p.get(100, pk).unwrap(), &[100u8; 5000][..]);
        assert_eq!(p.get(7, cp).unwrap(), &[7u8; 3][..]);
        assert_eq!(p.get(9000, pk).unwrap(), &[(9000 % 251) as u8][..]);
        assert!(p.get(8, pk).is_none() && p.get(7, pk).is_none() && p.get(100, cp).is_none());
        p.forget(7);
        assert!(p.get(7, cp).is_none() && p.held().count() == 2);
    }

    #[test]
    fn the_arena_starts_on_a_huge_page_boundary() {
        let mut p =
            WeightArena::reserve(&[(0, 3 << 20, Held::Copy), (1, 10, Held::Packed)]).unwrap();
        let parts = p.parts_mut();
        let first = parts.iter().find(|(o, _)| *o == 0).unwrap();
        assert_eq!(first.1.as_ptr() as usize % HUGE, 0);
    }

    #[test]
    fn nothing_wanted_maps_nothing() {
        let mut p = WeightArena::reserve(&[]).unwrap();
        assert!(p.parts_mut().is_empty() && p.get(0, Held::Copy).is_none());
    }
}
