//! The loop every packed decode layout shares (`q4k_packed`, `q8_0_packed`,
//! `q4_packed`): for each group of sixteen rows, the activation rows go
//! through the format's pass eight at a time, then four, two, one, and each
//! pass writes sixteen floats per token. Only the pass differs by format.
//!
//! Why eight: a batched decode step of eight rows reads each group from
//! memory once either way, but in two passes of four the second one
//! computes from cache with no load in flight, so the time spent waiting for
//! the weights and the time spent on the tokens' products added up. One
//! pass of eight overlaps them.

/// The widest pass: its sums stay in the 32 vector registers.
pub(super) const TOKENS: usize = 8;

/// How far ahead of the block in use a pass asks for the weights, in bytes
/// (about 25 Q4_1 blocks of a group, four Q4_K super-blocks).
const AHEAD: usize = 8192;

pub(crate) use crate::quant::BlockSide;

use super::{f16_at, Block32};

/// How far ahead of its blocks a pass of `N` tokens asks for the weights
/// (0: it leaves them to the hardware prefetcher); a pass reads it once
/// and hands it to `prefetch_ahead` at each block (Q4_K: to
/// `prefetch_line` with each word it loads).
///
/// The weights stream from memory once per step. With four tokens or more
/// the products keep the core busy long enough that the hardware prefetcher
/// falls behind: asking for the bytes AHEAD on (past a group's end, the next
/// group, which follows it) keeps loads in flight meanwhile (SmolLM2, 8 rows
/// about 8% faster at 2.5 KB ahead; 8 KB ahead was level with 2.5 KB or
/// 2% faster on an Intel Xeon). With fewer tokens the core waits on
/// the stream itself, and whether asking helps depends on the core. On an
/// Intel Xeon (CPUID family 6, model 207) one decode thread alone read SmolLM2
/// at about 12 GB/s and prefetching 8 KB ahead made the step 12-25%
/// shorter on one thread and 0-5% on two; a synthetic 1.7B Q4_K_M's step
/// 20% shorter on both. On two AMD Zen 4 cores it made SmolLM2's two-thread
/// step about 6% longer (2.5 KB ahead, a block's bytes at once into L1),
/// so there it stays off; the spread L2 requests `prefetch_line` makes now
/// were measured on Intel only.
#[inline(always)]
pub(super) fn ahead_bytes<const N: usize>() -> usize {
    if N >= 4 || crate::simd::intel_cpu() {
        AHEAD
    } else {
        0
    }
}

/// Called by a pass at each packed block `blk` of `bytes`, with the
/// distance `ahead_bytes` gave it: the block's bytes that far on, into L1.
#[inline(always)]
pub(super) fn prefetch_ahead(blk: *const u8, ahead: usize, bytes: usize) {
    if ahead != 0 {
        crate::simd::prefetch_bytes(blk.wrapping_add(ahead), bytes);
    }
}

/// Called by a pass as it loads word `off` (64 bytes) of the packed block
/// at `blk`, and through `prefetch_span` for other bytes of it (Q4_K's
/// scales once a block, a sixteenth of Q6_K's block per group), with its
/// distance (`ahead_bytes`'s; Q6_K's own): asks for the line `ahead` bytes
/// on, into L2.
///
/// Why, for Q4_K's super-blocks: asked for at once, a block's 36 lines
/// came in bursts that filled the core's line-fill buffers and held up the
/// products behind them, so the time reading the weights and the time
/// computing on them added up instead of overlapping. Spread over the
/// loads, one line each into L2 (synthetic 1.7B Q4_K_M, Intel Xeon, CPUID
/// model 207, alternated): eight rows 92 -> 77 ms a step on two threads,
/// 161 -> 131 on one; one row 44 -> 41-42 ms on two, 81-83 -> 74-78 on one.
/// Into L1 the same way was 1-3% slower. The 32-element formats' passes
/// (blocks of 5-9 lines) measured level or up to 7% slower this way
/// (SmolLM2, one row), so they keep `prefetch_ahead`.
#[inline(always)]
pub(super) fn prefetch_line(blk: *const u8, ahead: usize, off: usize) {
    if ahead != 0 {
        let at = blk.wrapping_add(ahead + off) as *const i8;
        // SAFETY: a prefetch dereferences nothing and never faults; the
        // packed kernels run only where AVX-512 (so SSE) is present.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(at) };
    }
}

/// `prefetch_line` for bytes `from..to` of a block, a line at a time.
#[inline(always)]
pub(super) fn prefetch_span(blk: *const u8, ahead: usize, from: usize, to: usize) {
    for off in (from..to).step_by(64) {
        prefetch_line(blk, ahead, off);
    }
}

/// One format's kernel over one group of sixteen packed rows.
pub(super) trait GroupPass {
    /// Bytes of one packed block of a group (all sixteen rows).
    const PACKED: usize;

    /// The group's `nb` packed blocks at `grp` against `N` activation rows
    /// (`a[t]`, with the scalars of its blocks at `side[t]` where the
    /// format reads them), writing each token's sixteen values to `out[t]`.
    ///
    /// # Safety
    /// The format's CPU features are present; `grp` holds `nb * PACKED`
    /// bytes, every `a[t]` `nb` activation blocks, every `side[t]` `nb`
    /// entries if the format reads them, and every `out[t]` sixteen floats.
    unsafe fn pass<const N: usize>(
        nb: usize,
        grp: *const u8,
        a: [*const u8; N],
        side: [*const BlockSide; N],
        out: [*mut f32; N],
    );
}

/// Writes into `out` each token's `BlockSide` per block (`nb` per token,
/// one token after another) for the 32-element weight format `F` against
/// its activation rows `acts` (`F::A`-byte blocks: the scale `d` at byte 0,
/// Q8_1's `s` at byte 2, the 32 quants last).
///
/// Why a table: a pass runs every group of sixteen rows against the same
/// activation blocks, and converting their f16 scalars and broadcasting
/// them from general registers there took about as many vector
/// instructions as the products of an eight-token pass. Read from here,
/// each is a broadcast operand of the instruction that uses it.
pub(super) fn sides<F: Block32>(acts: &[&[u8]], nb: usize, out: &mut Vec<BlockSide>) {
    assert!(
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c"),
        "block sides without AVX2 and F16C"
    );
    // SAFETY: both features were asserted above.
    unsafe { sides_f16c::<F>(acts, nb, out) }
}

/// `sides`, where the f16 scalars convert inline.
#[target_feature(enable = "avx2,f16c")]
unsafe fn sides_f16c<F: Block32>(acts: &[&[u8]], nb: usize, out: &mut Vec<BlockSide>) {
    out.clear();
    out.reserve(acts.len() * nb);
    for a in acts {
        assert!(a.len() >= nb * F::A, "activation row too short");
        for b in a.chunks_exact(F::A).take(nb) {
            // SAFETY: F16C is enabled here; `b` holds a whole activation
            // block, so its first four bytes are readable.
            let (d, s) = unsafe { (f16_at(b.as_ptr()), f16_at(b.as_ptr().add(2))) };
            let off = if F::OFFSET == 0 {
                0
            } else {
                // |sum| <= 32 * 128 and OFFSET <= 128: exact in i32.
                let sum: i32 = b[F::A - 32..].iter().map(|&q| q as i8 as i32).sum();
                sum * F::OFFSET
            };
            let s = if F::MIN { s } else { 0.0 };
            out.push(BlockSide { d, s, off });
        }
    }
}

/// Rows per group of every packed layout: the sixteen i32 lanes.
const GROUP_ROWS: usize = 16;

/// The walk every layout's `pack` shares: checks the shapes (`rows` a
/// multiple of 16, `cols` of `qk`, `data` the file's `block`-byte blocks,
/// `out` `packed` bytes per group and block) and calls `each(blocks, dst)`
/// for each group of sixteen rows and block, in packed order, with the
/// group's sixteen file blocks at that place and their `packed` bytes of
/// `out`. `what` names the format in the messages.
#[allow(clippy::too_many_arguments)]
pub(super) fn pack_groups(
    what: &str,
    (qk, block, packed): (usize, usize, usize),
    rows: usize,
    cols: usize,
    data: &[u8],
    out: &mut [u8],
    mut each: impl FnMut(&[&[u8]; GROUP_ROWS], &mut [u8]),
) {
    let nb = cols / qk;
    let rb = nb * block;
    assert!(
        rows.is_multiple_of(GROUP_ROWS) && cols.is_multiple_of(qk) && data.len() == rows * rb,
        "{what} pack shape"
    );
    assert_eq!(
        out.len(),
        rows / GROUP_ROWS * nb * packed,
        "{what} packed size"
    );
    for (gi, dst) in out.chunks_exact_mut(packed).enumerate() {
        let (g, i) = (gi / nb, gi % nb);
        let at = |r: usize| (g * GROUP_ROWS + r) * rb + i * block;
        let blocks: [&[u8]; GROUP_ROWS] = std::array::from_fn(|r| &data[at(r)..at(r) + block]);
        each(&blocks, dst);
    }
}

/// `tile` of a layout of 256-element super-blocks read against Q8_K rows,
/// which carry their own sums (Q4_K, Q6_K).
///
/// # Safety
/// `P`'s CPU features are present.
pub(super) unsafe fn q8k_tile<P: GroupPass>(
    n: usize,
    packed: &[u8],
    groups: (usize, usize),
    acts: &[&[u8]],
    outs: &mut [&mut [f32]],
) {
    use crate::quant::{q8_k, QK_K};
    let nb = n / QK_K;
    assert!(
        acts.iter().all(|a| a.len() >= nb * q8_k::BLOCK),
        "packed tile operand too short"
    );
    // SAFETY: the features are the caller's; the operands were checked.
    unsafe { run_groups::<P>(nb, packed, groups, acts, &[], outs) }
}

/// Groups `g0..g1` (each `nb` packed blocks) against every activation row:
/// `outs[t][(g - g0) * 16 + r]` is row `16g + r` against token t.
/// `side` is `sides`' table for these activation rows, or empty for a
/// format that reads none.
///
/// # Safety
/// `P`'s CPU features are present.
pub(super) unsafe fn run_groups<P: GroupPass>(
    nb: usize,
    packed: &[u8],
    (g0, g1): (usize, usize),
    acts: &[&[u8]],
    side: &[BlockSide],
    outs: &mut [&mut [f32]],
) {
    const ROWS: usize = 16;
    assert!(
        packed.len() >= g1 * nb * P::PACKED
            && acts.len() == outs.len()
            && (side.is_empty() || side.len() == acts.len() * nb)
            && outs.iter().all(|o| o.len() >= (g1 - g0) * ROWS),
        "packed tile operand too short"
    );
    let sides = |t: usize| side.get(t * nb..).map_or(std::ptr::null(), |s| s.as_ptr());
    for g in g0..g1 {
        let grp = packed[g * nb * P::PACKED..].as_ptr();
        let o = (g - g0) * ROWS;
        let mut t = 0;
        while t < acts.len() {
            let n = match acts.len() - t {
                left if left >= TOKENS => TOKENS,
                left if left >= 4 => 4,
                left if left >= 2 => 2,
                _ => 1,
            };
            // Sixteen floats at o of each token's output (bounds checked by
            // the slicing).
            let mut dst = |k: usize| outs[t + k][o..o + ROWS].as_mut_ptr();
            let a = |k: usize| acts[t + k].as_ptr();
            // One pass of n tokens, the arrays built for its width.
            macro_rules! pass {
                ($n:expr) => {
                    P::pass::<{ $n }>(
                        nb,
                        grp,
                        std::array::from_fn(a),
                        std::array::from_fn(|k| sides(t + k)),
                        std::array::from_fn(&mut dst),
                    )
                };
            }
            // SAFETY (each pass): the features are the caller's; group g,
            // the tokens' nb blocks (checked by the callers) and their nb
            // side entries (asserted) are in bounds, and each output was
            // sliced.
            unsafe {
                match n {
                    TOKENS => pass!(TOKENS),
                    4 => pass!(4),
                    2 => pass!(2),
                    _ => pass!(1),
                }
            }
            t += n;
        }
    }
}

/// A Q8_K layout's `tile` entry and its `GroupPass`, for a module that
/// defines `available()`, `PACKED_BLOCK` and
/// `unsafe fn pass<const N: usize>(nb, grp, a, out)` (the layouts that
/// read Q8_K's own sums, no side table): the same few lines each would
/// otherwise repeat.
macro_rules! q8k_packed_tile {
    ($what:literal) => {
        /// Groups `g0..g1` of a packed matrix of `n`-element rows against
        /// every activation row: `outs[t][(g - g0) * 16 + r]` is row
        /// `16g + r` against token t.
        pub fn tile(
            n: usize,
            packed: &[u8],
            groups: (usize, usize),
            acts: &[&[u8]],
            outs: &mut [&mut [f32]],
        ) {
            assert!(
                available(),
                concat!("packed ", $what, " kernel without AVX-512 VNNI")
            );
            // SAFETY: the features were asserted above.
            unsafe { super::packed_groups::q8k_tile::<Layout>(n, packed, groups, acts, outs) }
        }

        /// This layout's pass, for `run_groups` (it reads Q8_K's own sums).
        struct Layout;

        impl super::packed_groups::GroupPass for Layout {
            const PACKED: usize = PACKED_BLOCK;
            unsafe fn pass<const N: usize>(
                nb: usize,
                grp: *const u8,
                a: [*const u8; N],
                _side: [*const super::packed_groups::BlockSide; N],
                out: [*mut f32; N],
            ) {
                // SAFETY: the trait's contract is `pass`'s.
                unsafe { pass::<N>(nb, grp, a, out) }
            }
        }
    };
}
pub(super) use q8k_packed_tile;
