//! Token masks: which tokens the grammar allows next.
//!
//! A mask is a walk of the vocabulary trie carrying the set of parse stacks
//! the bytes so far lead to; a subtree is cut as soon as no stack survives.
//! Two caches make the walk rare:
//!
//! - Per stack *top*, the walk is computed once with only the top `DEPTH`
//!   frames real and the rest symbolic. Tokens that stay inside those
//!   frames are allowed or refused whatever lies below ("local" tokens, the
//!   bulk of the vocabulary); the trie nodes where a stack pops into the
//!   symbolic part are kept as escapes, and only their subtrees are walked
//!   again with the real stack. Inside a JSON string, say, every token
//!   without a quote is decided by the cache.
//! - Per whole state, the finished mask (bounded LRU-free map, cleared when
//!   full), since generation revisits states.

use rustc_hash::FxHashMap;

use super::program::Elem;
use super::stack::{canonical, Config, Stacks, ACCEPT, EMPTY, ESCAPE, SYM};
use super::trie::{VocabTrie, MANY, ROOT};
use super::utf8::Step;
use crate::Result;

/// Frames of a stack kept real in a cached local walk.
pub const DEPTH: usize = 3;
/// Distinct stacks the transition tables hold before they are cleared.
const MAX_MEMO_CONFIGS: usize = 1 << 16;
/// Distinct stack sets (512 bytes of transitions each) before the same.
const MAX_MEMO_SETS: usize = 1 << 14;
/// Work one mask may take (stack steps computed plus trie nodes walked)
/// before the grammar is refused as too ambiguous. A grammar can make every
/// byte of every token multiply the live parse stacks (`.` repeated inside
/// a rule that recurses through it): the fuzzer found one whose first mask
/// took 26 s. The grammar and JSON Schema tests' largest mask takes 140
/// thousand units; this limit is about 240 times that, and a quarter of a
/// second of work.
pub const MAX_MASK_WORK: u64 = 1 << 25;
const UNKNOWN: u32 = u32::MAX;
/// Unfilled entry of a set row; rows hold u16 set ids so a walk's working
/// rows stay in L1 (half the footprint of u32 ids).
const UNKNOWN_SET: u16 = u16::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LocalKey {
    pos: u32,
    sub: u32,
    frames: [u32; DEPTH],
    n: u8,
    /// The stack ends after the `n` frames (else more frames follow).
    ends: bool,
}

pub struct Local {
    pub bits: Box<[u64]>,
    /// Trie nodes where the walk popped into the symbolic frames.
    pub escapes: Box<[u32]>,
}

/// Byte transitions of stacks, memoized as dense tables: each stack seen by
/// a walk gets an id and a 256-entry row (filled lazily) pointing at the
/// ids of the stacks that byte leads to. A walk then advances by array
/// lookups instead of closures and hashing.
#[derive(Default)]
pub struct Memo {
    ids: FxHashMap<Config, u32>,
    configs: Vec<Config>,
    rows: Vec<[u32; 256]>,
    /// Result sets: `store[ranges[r].0..ranges[r].1]`, sorted ids.
    ranges: Vec<(u32, u32)>,
    store: Vec<u32>,
    tmp: Vec<Config>,
    /// Sets of stack ids, interned: a walk carries one set id per trie
    /// node and advances it by one row lookup (a lazily built DFA over
    /// stack sets).
    set_ids: FxHashMap<Box<[u32]>, u32>,
    sets: Vec<SetInfo>,
    set_rows: Vec<[u16; 256]>,
    /// Per set, `NONEMPTY | LIVE | ESCAPES` bits: the walk's hot loop reads
    /// one byte per node instead of a `SetInfo`.
    flags: Vec<u8>,
    scratch: Vec<u32>,
    /// A walk's bitset (kept to reuse its allocation).
    bits: Vec<u64>,
    /// Work done since the current mask began (see `MAX_MASK_WORK`).
    pub work: u64,
}

const NONEMPTY: u8 = 1;
/// Some member can still consume bytes.
const LIVE: u8 = 2;
/// Some member popped into the symbolic frames.
const ESCAPES: u8 = 4;

struct SetInfo {
    members: Box<[u32]>,
    /// Row entries computed one by one so far (see `fill_alike`).
    misses: u32,
}

impl Memo {
    fn clear(&mut self) {
        self.ids.clear();
        self.configs.clear();
        self.rows.clear();
        self.ranges.clear();
        self.store.clear();
        self.set_ids.clear();
        self.sets.clear();
        self.set_rows.clear();
        self.flags.clear();
    }

    /// The id of a sorted, deduplicated set of stack ids.
    fn set_id(&mut self, members: &[u32]) -> Result<u32> {
        if let Some(&i) = self.set_ids.get(members) {
            return Ok(i);
        }
        let i = self.sets.len() as u32;
        if i >= u32::from(UNKNOWN_SET) {
            // Only a wildly ambiguous grammar makes this many distinct stack
            // sets within one walk (tables are cleared between walks).
            return Err(crate::Error::invalid(
                "grammar is too ambiguous to mask (too many parse states in one walk)",
            ));
        }
        let (mut live, mut escape) = (false, false);
        for &m in members {
            match self.configs[m as usize].pos {
                ESCAPE => escape = true,
                ACCEPT => {}
                _ => live = true,
            }
        }
        self.sets.push(SetInfo {
            members: members.into(),
            misses: 0,
        });
        let nonempty = if members.is_empty() { 0 } else { NONEMPTY };
        self.flags
            .push(nonempty | if live { LIVE } else { 0 } | if escape { ESCAPES } else { 0 });
        self.set_rows.push([UNKNOWN_SET; 256]);
        self.set_ids.insert(members.into(), i);
        Ok(i)
    }

    /// The set byte `b` leads set `sid` to (possibly the empty set).
    #[inline(always)]
    fn step_set(&mut self, stacks: &mut Stacks, sid: u32, b: u8) -> Result<u32> {
        let r = self.set_rows[sid as usize][b as usize];
        if r != UNKNOWN_SET {
            return Ok(u32::from(r));
        }
        self.step_set_slow(stacks, sid, b)
    }

    /// A transition seen for the first time (kept out of the walk's loop).
    #[cold]
    #[inline(never)]
    fn step_set_slow(&mut self, stacks: &mut Stacks, sid: u32, b: u8) -> Result<u32> {
        let members = self.sets[sid as usize].members.clone();
        self.charge(members.len() as u64)?;
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        let res = self.advance(stacks, &members, b, &mut out);
        if let Err(e) = res {
            self.scratch = out;
            return Err(e);
        }
        out.sort_unstable();
        out.dedup();
        let next = self.set_id(&out);
        self.scratch = out;
        let next = next?;
        // `set_id` keeps ids below UNKNOWN_SET.
        self.set_rows[sid as usize][b as usize] = next as u16;
        let info = &mut self.sets[sid as usize];
        info.misses += 1;
        // A set asked about a second byte will likely be asked about most:
        // a walk tries every byte a vocabulary continues with.
        if info.misses == 2 {
            let steps = self.fill_alike(stacks, sid, b, next as u16);
            self.charge(steps)?;
        }
        Ok(next)
    }

    /// Copies the transition of `b` to every unfilled byte the set's stacks
    /// treat exactly like `b` (the same step result for each member), since
    /// the next set depends on nothing else. Inside a string, all ASCII
    /// letters, or all 64 continuation bytes of a collapsed UTF-8 state,
    /// then cost one closure instead of one each. Returns the member steps
    /// it took (its share of the mask's work).
    fn fill_alike(&mut self, stacks: &Stacks, sid: u32, b: u8, next: u16) -> u64 {
        let prog = &stacks.prog;
        let members = &self.sets[sid as usize].members;
        let step = |id: u32, byte: u8| {
            let c = self.configs[id as usize];
            if c.pos >= ESCAPE {
                return None;
            }
            match prog.elems.get(c.pos as usize) {
                Some(Elem::Chars(k)) => {
                    prog.classes.get(*k as usize).map(|cl| cl.step(c.sub, byte))
                }
                _ => None,
            }
        };
        let want: Vec<Option<Step>> = members.iter().map(|&m| step(m, b)).collect();
        let row = &mut self.set_rows[sid as usize];
        let mut steps = members.len() as u64;
        for other in 0..=255u8 {
            if row[other as usize] == UNKNOWN_SET
                && members.iter().zip(&want).all(|(&m, w)| {
                    steps += 1;
                    step(m, other) == *w
                })
            {
                row[other as usize] = next;
            }
        }
        steps
    }

    /// Counts `n` units of work against the current mask's budget.
    #[inline]
    pub fn charge(&mut self, n: u64) -> Result<()> {
        self.work += n;
        if self.work > MAX_MASK_WORK {
            return Err(crate::Error::invalid(
                "grammar is too ambiguous to mask (work limit reached)",
            ));
        }
        Ok(())
    }

    /// The id of a stack (registered on first sight).
    pub fn id(&mut self, c: Config) -> u32 {
        if let Some(&i) = self.ids.get(&c) {
            return i;
        }
        let i = self.configs.len() as u32;
        self.ids.insert(c, i);
        self.configs.push(c);
        self.rows.push([UNKNOWN; 256]);
        i
    }

    #[inline]
    fn config(&self, id: u32) -> Config {
        self.configs[id as usize]
    }

    /// Ids of the stacks byte `b` leads stack `id` to.
    #[inline]
    fn step(&mut self, stacks: &mut Stacks, id: u32, b: u8) -> Result<(u32, u32)> {
        let r = self.rows[id as usize][b as usize];
        if r != UNKNOWN {
            return Ok(self.ranges[r as usize]);
        }
        let c = self.config(id);
        self.tmp.clear();
        let mut tmp = std::mem::take(&mut self.tmp);
        let spent = stacks.spent;
        let res = stacks.advance(&[c], b, &mut tmp);
        canonical(&mut tmp);
        self.work += tmp.len() as u64 + (stacks.spent - spent);
        let lo = self.store.len() as u32;
        for &n in &tmp {
            let i = self.id(n);
            self.store.push(i);
        }
        self.tmp = tmp;
        res?;
        self.store[lo as usize..].sort_unstable();
        let range = (lo, self.store.len() as u32);
        self.rows[id as usize][b as usize] = self.ranges.len() as u32;
        self.ranges.push(range);
        Ok(range)
    }

    /// Advances a set of stack ids by `b`, appending the (deduplicated)
    /// result to `out`.
    fn advance(
        &mut self,
        stacks: &mut Stacks,
        set: &[u32],
        b: u8,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        let start = out.len();
        for &id in set {
            let (lo, hi) = self.step(stacks, id, b)?;
            out.extend_from_slice(&self.store[lo as usize..hi as usize]);
        }
        if set.len() > 1 && out.len() - start > 1 {
            out[start..].sort_unstable();
            let mut w = start + 1;
            for r in start + 1..out.len() {
                if out[r] != out[w - 1] {
                    out[w] = out[r];
                    w += 1;
                }
            }
            out.truncate(w);
        }
        Ok(())
    }

    /// Keeps the tables bounded; call between walks only (ids change).
    pub fn trim(&mut self) {
        if self.configs.len() > MAX_MEMO_CONFIGS || self.sets.len() > MAX_MEMO_SETS {
            self.clear();
        }
    }
}

#[inline]
fn set_bit(bits: &mut [u64], t: u32) {
    if let Some(w) = bits.get_mut(t as usize / 64) {
        *w |= 1 << (t % 64);
    }
}

/// Walks the trie below `start` with stacks `set`, marking every token whose
/// bytes some stack accepts. Escaping stacks stop and record their node.
pub fn walk(
    stacks: &mut Stacks,
    memo: &mut Memo,
    trie: &VocabTrie,
    start: u32,
    set: &[Config],
    bits: &mut [u64],
    mut escapes: Option<&mut Vec<u32>>,
) -> Result<()> {
    memo.trim();
    let mut first: Vec<u32> = set
        .iter()
        .filter(|c| c.pos < ESCAPE)
        .map(|&c| memo.id(c))
        .collect();
    first.sort_unstable();
    first.dedup();
    let sid = memo.set_id(&first)?;
    let nodes = trie.nodes();
    let Some(root) = nodes.get(start as usize) else {
        return Ok(());
    };
    let base = root.depth as usize;
    let end = (root.skip as usize).min(nodes.len());
    // `by_depth[d]` is the stack set after the first `d` bytes below
    // `start` on the current path; preorder guarantees the entry for a
    // node's parent depth was written by its parent.
    let mut by_depth: Vec<u32> = vec![sid; trie.max_depth() + 1];
    // Tokenless nodes carry `trie::NO_TOKEN`; clamping it to `spare` sends their
    // bit to a spare word, so marking needs no branch per node.
    let spare = (trie.n_vocab() as u32).min(bits.len() as u32 * 64);
    let mut local = std::mem::take(&mut memo.bits);
    local.clear();
    local.resize(spare as usize / 64 + 1, 0);
    let mut i = start as usize + 1;
    let mut visited = 0u64;
    while i < end {
        visited += 1;
        let n = nodes[i];
        let d = n.depth as usize - base;
        let parent = by_depth[d - 1];
        let next = memo.step_set(stacks, parent, n.byte)?;
        let flags = memo.flags[next as usize];
        if flags & NONEMPTY == 0 {
            i = n.skip as usize;
            continue;
        }
        if n.token == MANY {
            for t in trie.many_tokens(i as u32) {
                set_bit(&mut local, t);
            }
        } else {
            let t = n.token.min(spare);
            local[t as usize / 64] |= 1 << (t % 64);
        }
        if flags & ESCAPES != 0 {
            if let Some(e) = escapes.as_deref_mut() {
                e.push(i as u32);
            }
        }
        if flags & LIVE == 0 {
            i = n.skip as usize;
            continue;
        }
        by_depth[d] = next;
        i += 1;
    }
    local[spare as usize / 64] &= !(1u64 << (spare % 64));
    for (w, l) in bits.iter_mut().zip(&local) {
        *w |= l;
    }
    memo.bits = local;
    memo.charge(visited)
}

/// The cache key of a terminal stack, and the real node its symbolic
/// bottom stands for (`EMPTY` when the key covers the whole stack).
pub fn local_key(stacks: &Stacks, c: Config) -> (LocalKey, u32) {
    let mut frames = [0u32; DEPTH];
    let mut n = 0;
    let mut node = c.parent;
    while n < DEPTH && node != EMPTY {
        let (pos, parent) = stacks.node(node);
        frames[n] = pos;
        n += 1;
        node = parent;
    }
    let key = LocalKey {
        pos: c.pos,
        sub: c.sub,
        frames,
        n: n as u8,
        ends: node == EMPTY,
    };
    (key, node)
}

/// Computes the local walk of a key (see the module comment).
pub fn local_walk(
    stacks: &mut Stacks,
    memo: &mut Memo,
    trie: &VocabTrie,
    key: &LocalKey,
) -> Result<Local> {
    let bottom = if key.ends { EMPTY } else { SYM };
    let parent = stacks.build(&key.frames[..key.n as usize], bottom)?;
    let c = Config {
        pos: key.pos,
        sub: key.sub,
        parent,
    };
    let mut bits = vec![0u64; trie.n_vocab().div_ceil(64)];
    let mut escapes = Vec::new();
    walk(
        stacks,
        memo,
        trie,
        ROOT,
        &[c],
        &mut bits,
        Some(&mut escapes),
    )?;
    escapes.sort_unstable();
    escapes.dedup();
    Ok(Local {
        bits: bits.into_boxed_slice(),
        escapes: escapes.into_boxed_slice(),
    })
}
