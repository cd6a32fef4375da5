//! Matching one code point of a character class a byte at a time.
//!
//! A partly read code point is kept in a `u32` "sub-state": bit 31 set, the
//! sequence length in bits 28..30, the bytes still missing in bits 24..26,
//! the bits read so far in 0..21. After each byte we check that some code
//! point of the class still starts with what was read, so a dead prefix is
//! cut at its first byte.
//!
//! When the class holds every code point the bytes so far can still lead
//! to, and none of those can be overlong, a surrogate or past U+10FFFF,
//! the read bits no longer matter: the sub-state drops them and sets `ANY`,
//! keeping only the count. So inside a JSON string (`[^"\\]`), the
//! thousands of partial CJK or emoji prefixes in a vocabulary are a handful
//! of states instead of one each, and a mask walk shares its transition
//! tables across them.

/// What one byte does to a partial code point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The code point is complete and in the class.
    Done,
    /// More bytes are needed; the new sub-state.
    More(u32),
    /// No code point of the class continues this way.
    Dead,
}

/// A character class: sorted, disjoint, inclusive code point ranges, and an
/// ASCII bitmap for the common case.
#[derive(Debug, Clone)]
pub struct CharClass {
    ranges: Box<[(u32, u32)]>,
    ascii: [u64; 2],
}

const MIN_BY_LEN: [u32; 5] = [0, 0, 0x80, 0x800, 0x1_0000];
/// Sub-state flag: any continuation bytes complete a code point of the class.
pub const ANY: u32 = 1 << 27;

impl CharClass {
    pub fn new(mut ranges: Vec<(u32, u32)>) -> Self {
        ranges.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
        for (lo, hi) in ranges {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        let mut ascii = [0u64; 2];
        for &(lo, hi) in &merged {
            for c in lo..=hi.min(127) {
                ascii[(c / 64) as usize] |= 1 << (c % 64);
            }
        }
        CharClass {
            ranges: merged.into_boxed_slice(),
            ascii,
        }
    }

    /// Whether any code point in `lo..=hi` is in the class.
    fn overlaps(&self, lo: u32, hi: u32) -> bool {
        // First range ending at or after `lo`.
        let i = self.ranges.partition_point(|&(_, h)| h < lo);
        i < self.ranges.len() && self.ranges[i].0 <= hi
    }

    /// The class's smallest code point that is a valid `char` (not a
    /// surrogate), if any: the cheapest one to spell.
    pub fn smallest(&self) -> Option<u32> {
        self.ranges.iter().find_map(|&(lo, hi)| {
            if !(0xD800..=0xDFFF).contains(&lo) {
                Some(lo)
            } else if hi > 0xDFFF {
                Some(0xE000)
            } else {
                None
            }
        })
    }

    pub fn contains(&self, c: u32) -> bool {
        if c < 128 {
            return self.ascii[(c / 64) as usize] >> (c % 64) & 1 == 1;
        }
        self.overlaps(c, c)
    }

    /// Whether every code point in `lo..=hi` is in the class.
    fn covers(&self, lo: u32, hi: u32) -> bool {
        let i = self.ranges.partition_point(|&(_, h)| h < lo);
        i < self.ranges.len() && self.ranges[i].0 <= lo && self.ranges[i].1 >= hi
    }

    /// Feeds byte `b` to sub-state `sub` (0 = at a code point boundary).
    #[inline]
    pub fn step(&self, sub: u32, b: u8) -> Step {
        let b = u32::from(b);
        let (len, rem, acc) = if sub == 0 {
            match b {
                0x00..=0x7F => {
                    return if self.ascii[(b / 64) as usize] >> (b % 64) & 1 == 1 {
                        Step::Done
                    } else {
                        Step::Dead
                    };
                }
                0xC2..=0xDF => (2, 1, b & 0x1F),
                0xE0..=0xEF => (3, 2, b & 0x0F),
                0xF0..=0xF4 => (4, 3, b & 0x07),
                _ => return Step::Dead,
            }
        } else {
            if b & 0xC0 != 0x80 {
                return Step::Dead;
            }
            let len = (sub >> 28) & 7;
            let rem = (sub >> 24) & 3;
            if rem == 0 || !(2..=4).contains(&len) {
                return Step::Dead; // not a sub-state this module wrote
            }
            if sub & ANY != 0 {
                return if rem == 1 {
                    Step::Done
                } else {
                    Step::More((1 << 31) | ANY | (len << 28) | ((rem - 1) << 24))
                };
            }
            (len, rem - 1, ((sub & 0x1F_FFFF) << 6) | (b & 0x3F))
        };
        let shift = 6 * rem;
        let raw_lo = acc << shift;
        let raw_hi = raw_lo | ((1u32 << shift) - 1);
        let lo = raw_lo.max(MIN_BY_LEN[len as usize]);
        let hi = raw_hi.min(0x10_FFFF);
        // Surrogates are not scalar values: never matched.
        let (lo, hi) = if rem == 0 && (0xD800..=0xDFFF).contains(&lo) {
            return Step::Dead;
        } else {
            (lo, hi)
        };
        if lo > hi || !self.overlaps(lo, hi) {
            return Step::Dead;
        }
        if rem == 0 {
            Step::Done
        } else if lo == raw_lo
            && hi == raw_hi
            && (hi < 0xD800 || lo > 0xDFFF)
            && self.covers(lo, hi)
        {
            Step::More((1 << 31) | ANY | (len << 28) | (rem << 24))
        } else {
            Step::More((1 << 31) | (len << 28) | (rem << 24) | acc)
        }
    }
}
