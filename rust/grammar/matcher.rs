//! The live matcher of one generation: its current set of parse stacks, the
//! history that `rollback` returns to, and its mask caches.

use std::sync::{Arc, Mutex, OnceLock};

use rustc_hash::FxHashMap;

use super::mask::{self, Local, LocalKey, Memo};
use super::program::{Elem, Program};
use super::shortest::{segment_counts, Table, INF};
use super::stack::{canonical, Config, Stacks, ACCEPT, EMPTY};
use super::trie::VocabTrie;
use crate::{Error, Result};

/// Cached local walks (6 KB each for a 49k vocabulary) before the cache is
/// cleared.
const MAX_LOCALS: usize = 8192;

/// What the matchers of one program and vocabulary share: local walks
/// keyed by stack top, and the program's shortest completions (computed on
/// first use). The table lives here rather than in `Program` so that the
/// program, which the stacks and the table are built from, depends on
/// neither.
#[derive(Default)]
pub struct LocalCache {
    map: Mutex<FxHashMap<LocalKey, Arc<Local>>>,
    shortest: OnceLock<Table>,
}

impl LocalCache {
    fn get(&self, key: &LocalKey) -> Option<Arc<Local>> {
        // A poisoned lock only means another thread panicked mid-insert;
        // the map itself is still consistent.
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(key).cloned()
    }

    fn insert(&self, key: LocalKey, local: Arc<Local>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_LOCALS {
            map.clear();
        }
        map.insert(key, local);
    }
}

/// Whole-state masks kept before the map is cleared.
const MAX_STATE_MASKS: usize = 4096;
/// Words in an exported stack beyond which an import is refused.
const MAX_EXPORT_DEPTH: usize = 1 << 20;

pub struct Matcher {
    stacks: Stacks,
    trie: Arc<VocabTrie>,
    /// `history[0]` is the start state, the last one the current state.
    history: Vec<Vec<Config>>,
    memo: Memo,
    locals: Arc<LocalCache>,
    masks: FxHashMap<Vec<Config>, Arc<[u64]>>,
}

impl Matcher {
    pub fn new(prog: Arc<Program>, trie: Arc<VocabTrie>) -> Result<Matcher> {
        Self::with_cache(prog, trie, Arc::default())
    }

    /// A matcher sharing its per-top mask cache with others of the same
    /// program and vocabulary (the cached walks depend on nothing else), so
    /// the second generation with a grammar starts warm.
    pub fn with_cache(
        prog: Arc<Program>,
        trie: Arc<VocabTrie>,
        locals: Arc<LocalCache>,
    ) -> Result<Matcher> {
        let mut stacks = Stacks::new(prog);
        let mut start = Vec::new();
        stacks.start(&mut start)?;
        canonical(&mut start);
        Ok(Matcher {
            stacks,
            trie,
            history: vec![start],
            memo: Memo::default(),
            locals,
            masks: FxHashMap::default(),
        })
    }

    fn current(&self) -> &[Config] {
        self.history.last().map(Vec::as_slice).unwrap_or(&[])
    }

    /// Tokens accepted since the start (what `rollback` can undo).
    pub fn n_accepted(&self) -> usize {
        self.history.len() - 1
    }

    /// Whether the grammar may end here (EOS is allowed).
    pub fn is_accepting(&self) -> bool {
        self.current().iter().any(|c| c.pos == ACCEPT)
    }

    /// Whether the grammar has ended: nothing but the end can follow.
    pub fn is_terminated(&self) -> bool {
        self.current().iter().all(|c| c.pos == ACCEPT)
    }

    fn shortest(&self) -> &Table {
        let prog = &self.stacks.prog;
        self.locals.shortest.get_or_init(|| Table::new(prog))
    }

    /// One shortest (in bytes) completion from here, as text: `None` when
    /// there is no finite one or it does not spell out as text
    /// (mid-character, or a token reference).
    fn shortest_text(&self) -> Option<Vec<u8>> {
        let t = self.shortest();
        let best = self
            .current()
            .iter()
            .copied()
            .filter(|&c| t.stack_min(&self.stacks, c) != INF)
            .min_by_key(|&c| t.stack_min(&self.stacks, c))?;
        t.spell(&self.stacks.prog, &self.stacks, best)
    }

    /// The fewest bytes (a token reference counts one) that finish the
    /// grammar from here, `None` when no finite completion is known. No
    /// allocation: cheap enough to check after every token.
    pub fn min_completion_bytes(&self) -> Option<u32> {
        let t = self.shortest();
        let m = self
            .current()
            .iter()
            .map(|&c| t.stack_min(&self.stacks, c))
            .min()
            .unwrap_or(INF);
        (m != INF).then_some(m)
    }

    /// Tokens that finish the grammar from here along one shortest
    /// completion, spelled with as few tokens as the vocabulary allows;
    /// `None` when no completion spells out as text.
    pub fn min_completion_tokens(&self) -> Option<u32> {
        let text = self.shortest_text()?;
        let n = segment_counts(&self.trie, &text)[0];
        (n != INF).then_some(n)
    }

    /// The tokens that start the shortest completion and still let it
    /// finish within `left` tokens counting themselves (where the grammar
    /// may end, the end-of-generation tokens too). Taking one of them each
    /// step keeps the completion within the budget it had.
    pub fn shortest_path_tokens(&self, left: u32) -> Option<Vec<u32>> {
        let text = self.shortest_text()?;
        let counts = segment_counts(&self.trie, &text);
        let trie = &self.trie;
        let mut out: Vec<u32> = Vec::new();
        if self.is_accepting() {
            out.extend_from_slice(trie.eog());
        }
        let mut fallback: (u32, Vec<u32>) = (INF, Vec::new());
        for tok in 0..trie.n_vocab() as u32 {
            if trie.is_special(tok) {
                continue;
            }
            let Some(p) = trie.piece(tok) else { continue };
            if p.is_empty() || !text.starts_with(p) {
                continue;
            }
            let need = counts[p.len()].saturating_add(1);
            if need <= left {
                out.push(tok);
            } else if need < fallback.0 {
                fallback = (need, vec![tok]);
            } else if need == fallback.0 {
                fallback.1.push(tok);
            }
        }
        if out.is_empty() {
            // Over budget whatever comes: the quickest way to the end.
            out = fallback.1;
        }
        (!out.is_empty()).then_some(out)
    }

    /// Back to the start state.
    pub fn reset(&mut self) {
        self.history.truncate(1);
    }

    /// Undoes the last `n` accepted tokens.
    pub fn rollback(&mut self, n: usize) -> Result<()> {
        if n > self.n_accepted() {
            return Err(Error::invalid(format!(
                "cannot roll back {n} tokens: only {} were accepted",
                self.n_accepted()
            )));
        }
        self.history.truncate(self.history.len() - n);
        Ok(())
    }

    /// The state after `bytes` from the current state (empty: refused).
    fn after_bytes(&mut self, bytes: &[u8]) -> Result<Vec<Config>> {
        let mut set = self.current().to_vec();
        let mut next = Vec::new();
        for &b in bytes {
            next.clear();
            self.stacks.advance(&set, b, &mut next)?;
            canonical(&mut next);
            std::mem::swap(&mut set, &mut next);
            if set.is_empty() {
                break;
            }
        }
        Ok(set)
    }

    /// Advances by one token if the grammar allows it; returns whether it
    /// did (a refused token changes nothing). An end-of-generation token is
    /// allowed exactly where the grammar may end.
    pub fn accept_token(&mut self, token: u32) -> Result<bool> {
        let trie = Arc::clone(&self.trie);
        if token as usize >= trie.n_vocab() {
            return Err(Error::invalid(format!(
                "token {token} is outside the vocabulary of {}",
                trie.n_vocab()
            )));
        }
        let mut next = Vec::new();
        if trie.eog().contains(&token) && self.is_accepting() {
            next.push(Config {
                pos: ACCEPT,
                sub: 0,
                parent: EMPTY,
            });
        }
        let cur = self.current().to_vec();
        self.stacks.advance_token(&cur, token, &mut next)?;
        if !trie.is_special(token) {
            if let Some(piece) = trie.piece(token) {
                if !piece.is_empty() {
                    next.extend(self.after_bytes(piece)?);
                }
            }
        }
        canonical(&mut next);
        if next.is_empty() {
            return Ok(false);
        }
        self.history.push(next);
        Ok(true)
    }

    /// Advances by raw bytes (text the caller forces); returns whether the
    /// grammar accepts them. One history entry, like one token.
    pub fn accept_bytes(&mut self, bytes: &[u8]) -> Result<bool> {
        let next = self.after_bytes(bytes)?;
        if next.is_empty() {
            return Ok(false);
        }
        self.history.push(next);
        Ok(true)
    }

    /// Fills `bits` (one bit per token, LSB first) with the tokens allowed
    /// next.
    pub fn fill_mask(&mut self, bits: &mut [u64]) -> Result<()> {
        let words = self.trie.n_vocab().div_ceil(64);
        if bits.len() < words {
            return Err(Error::invalid(format!(
                "mask needs {words} words, got {}",
                bits.len()
            )));
        }
        let state = self.current().to_vec();
        if let Some(m) = self.masks.get(&state) {
            bits[..words].copy_from_slice(m);
            return Ok(());
        }
        bits.fill(0);
        self.memo.work = 0;
        let trie = Arc::clone(&self.trie);
        let prog = Arc::clone(&self.stacks.prog);
        for &c in &state {
            if c.pos == ACCEPT {
                for &t in trie.eog() {
                    bits[t as usize / 64] |= 1 << (t % 64);
                }
                continue;
            }
            match prog.elems[c.pos as usize] {
                Elem::Token { id, negated: false } => {
                    if (id as usize) < trie.n_vocab() {
                        bits[id as usize / 64] |= 1 << (id % 64);
                    }
                }
                Elem::Token { id, negated: true } => {
                    for t in 0..trie.n_vocab() as u32 {
                        if t != id && !trie.eog().contains(&t) {
                            bits[t as usize / 64] |= 1 << (t % 64);
                        }
                    }
                }
                _ => self.mask_chars(c, bits)?,
            }
        }
        if self.masks.len() >= MAX_STATE_MASKS {
            self.masks.clear();
        }
        self.masks.insert(state, bits[..words].into());
        Ok(())
    }

    /// Adds the tokens a stack with a character-class top accepts.
    fn mask_chars(&mut self, c: Config, bits: &mut [u64]) -> Result<()> {
        let (key, rest) = mask::local_key(&self.stacks, c);
        let cached = self.locals.get(&key);
        let local = match cached {
            Some(l) => l,
            None => {
                let l = Arc::new(mask::local_walk(
                    &mut self.stacks,
                    &mut self.memo,
                    &self.trie,
                    &key,
                )?);
                self.locals.insert(key, Arc::clone(&l));
                l
            }
        };
        for (w, l) in bits.iter_mut().zip(local.bits.iter()) {
            *w |= l;
        }
        if local.escapes.is_empty() {
            return Ok(());
        }
        // Pop the real frame the symbolic bottom stood for.
        let (pos, parent) = self.stacks.node(rest);
        self.stacks.seed(Config {
            pos,
            sub: 0,
            parent,
        });
        let mut seed = Vec::new();
        self.stacks.close(&mut seed)?;
        canonical(&mut seed);
        let trie = Arc::clone(&self.trie);
        for &node in local.escapes.iter() {
            mask::walk(
                &mut self.stacks,
                &mut self.memo,
                &trie,
                node,
                &seed,
                bits,
                None,
            )?;
        }
        Ok(())
    }

    /// The current state as words: per stack, `pos sub n_frames frames...`
    /// (frames top first, as element positions), preceded by the count.
    pub fn export_state(&self) -> Vec<u32> {
        let cur = self.current();
        let mut out = vec![cur.len() as u32];
        for c in cur {
            let frames = if c.parent == EMPTY {
                Vec::new()
            } else {
                self.stacks.frames(c.parent)
            };
            out.extend([c.pos, c.sub, frames.len() as u32]);
            out.extend(frames);
        }
        out
    }

    /// Replaces the state (and clears the history) with an exported one.
    pub fn import_state(&mut self, words: &[u32]) -> Result<()> {
        let bad = |what: &str| Error::invalid(format!("bad grammar state: {what}"));
        let n_elems = self.stacks.prog.elems.len() as u32;
        let mut it = words.iter().copied();
        let n = it.next().ok_or_else(|| bad("empty"))? as usize;
        if n > words.len() {
            return Err(bad("stack count exceeds the data"));
        }
        let mut set = Vec::with_capacity(n);
        for _ in 0..n {
            let pos = it.next().ok_or_else(|| bad("truncated"))?;
            let sub = it.next().ok_or_else(|| bad("truncated"))?;
            let depth = it.next().ok_or_else(|| bad("truncated"))? as usize;
            if depth > MAX_EXPORT_DEPTH || depth > words.len() {
                return Err(bad("stack depth exceeds the data"));
            }
            let mut frames = Vec::with_capacity(depth);
            for _ in 0..depth {
                let f = it.next().ok_or_else(|| bad("truncated"))?;
                if f >= n_elems {
                    return Err(bad("frame outside the grammar"));
                }
                frames.push(f);
            }
            let valid_top = pos == ACCEPT
                || (pos < n_elems
                    && matches!(
                        self.stacks.prog.elems[pos as usize],
                        Elem::Chars(_) | Elem::Token { .. }
                    ));
            if !valid_top || !valid_sub(sub, pos) {
                return Err(bad("stack top is not a terminal"));
            }
            let parent = self.stacks.build(&frames, EMPTY)?;
            set.push(Config { pos, sub, parent });
        }
        if it.next().is_some() {
            return Err(bad("trailing data"));
        }
        canonical(&mut set);
        if set.is_empty() {
            return Err(bad("no stacks"));
        }
        self.history.truncate(1);
        self.history.push(set);
        Ok(())
    }
}

/// A partial code point as `utf8::CharClass::step` writes it (or none).
fn valid_sub(sub: u32, pos: u32) -> bool {
    if sub == 0 {
        return true;
    }
    let (len, rem) = ((sub >> 28) & 7, (sub >> 24) & 3);
    pos != ACCEPT
        && sub >> 31 == 1
        && (2..=4).contains(&len)
        && rem >= 1
        && rem < len
        && sub & 0x04E0_0000 == 0
        // A collapsed state carries no code point bits.
        && (sub & crate::grammar::utf8::ANY == 0 || sub & 0x1F_FFFF == 0)
}
