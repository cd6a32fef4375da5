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
/// (about eight Q4 blocks of a group).
const AHEAD: usize = 2560;

/// Called by a pass of `N` tokens at each packed block `blk` of `bytes`.
///
/// The weights stream from memory once per step. With four tokens or more
/// the products keep the core busy long enough that the hardware prefetcher
/// falls behind: asking for the bytes AHEAD on (past a group's end, the next
/// group, which follows it) keeps loads in flight meanwhile. One token is
/// bound by the stream itself and the extra instructions only cost (SmolLM2
/// decode: 8 rows about 8% faster, 1 row about 6% slower when it did too).
#[inline(always)]
pub(super) fn prefetch_ahead<const N: usize>(blk: *const u8, bytes: usize) {
    if N >= 4 {
        crate::simd::prefetch_bytes(blk.wrapping_add(AHEAD), bytes);
    }
}

/// One format's kernel over one group of sixteen packed rows.
pub(super) trait GroupPass {
    /// Bytes of one packed block of a group (all sixteen rows).
    const PACKED: usize;

    /// The group's `nb` packed blocks at `grp` against `N` activation rows
    /// (`a[t]`, with block quant sums `asum[t]` where the format needs
    /// them), writing each token's sixteen values to `out[t]`.
    ///
    /// # Safety
    /// The format's CPU features are present; `grp` holds `nb * PACKED`
    /// bytes, every `a[t]` `nb` activation blocks, every `asum[t]` `nb`
    /// sums if the format reads them, and every `out[t]` sixteen floats.
    unsafe fn pass<const N: usize>(
        nb: usize,
        grp: *const u8,
        a: [*const u8; N],
        asum: [*const i32; N],
        out: [*mut f32; N],
    );
}

/// Each token's per-block sums of its `i8` quants (the `quants` bytes that
/// end each `block`-byte activation block), for the layouts that store
/// their quants offset to unsigned and subtract the offset times this sum.
pub(super) fn block_sums(acts: &[&[u8]], nb: usize, block: usize, quants: usize) -> Vec<Vec<i32>> {
    acts.iter()
        .map(|a| {
            a.chunks_exact(block)
                .take(nb)
                .map(|b| b[block - quants..].iter().map(|&q| q as i8 as i32).sum())
                .collect()
        })
        .collect()
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
/// `asum` is `block_sums`' result, or empty for a format that reads none.
///
/// # Safety
/// `P`'s CPU features are present.
pub(super) unsafe fn run_groups<P: GroupPass>(
    nb: usize,
    packed: &[u8],
    (g0, g1): (usize, usize),
    acts: &[&[u8]],
    asum: &[Vec<i32>],
    outs: &mut [&mut [f32]],
) {
    const ROWS: usize = 16;
    assert!(
        packed.len() >= g1 * nb * P::PACKED
            && acts.len() == outs.len()
            && (asum.is_empty() || asum.len() == acts.len() && asum.iter().all(|s| s.len() >= nb))
            && outs.iter().all(|o| o.len() >= (g1 - g0) * ROWS),
        "packed tile operand too short"
    );
    let sums = |t: usize| asum.get(t).map_or(std::ptr::null(), |s| s.as_ptr());
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
                        std::array::from_fn(|k| sums(t + k)),
                        std::array::from_fn(&mut dst),
                    )
                };
            }
            // SAFETY (each pass): the features are the caller's; group g,
            // the tokens' nb blocks (checked by the callers) and their nb
            // sums (asserted) are in bounds, and each output was sliced.
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
