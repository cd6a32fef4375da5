//! Parse stacks as hash-consed linked lists, and the closure that turns a
//! set of stacks into the set whose tops are all terminals.
//!
//! A stack is a `Config`: the position of the element to match next, the
//! partial code point inside it, and the node holding the rest of the stack
//! (return positions). Equal stacks are equal `Config`s, because nodes are
//! interned; sets of stacks are sorted, deduplicated `Vec<Config>`s.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::program::{Elem, Program};
use super::utf8::Step;
use crate::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Config {
    pub pos: u32,
    pub sub: u32,
    pub parent: u32,
}

/// `pos` of the stack that has matched the whole grammar.
pub const ACCEPT: u32 = u32::MAX;
/// `pos` of a stack that popped into the unknown part of a symbolic stack
/// (see `mask.rs`).
pub const ESCAPE: u32 = u32::MAX - 1;
/// `parent` below the last frame.
pub const EMPTY: u32 = u32::MAX;
/// `parent` standing for frames a cached computation does not look at.
pub const SYM: u32 = u32::MAX - 1;

/// Closure steps allowed per call: a grammar that needs more (only
/// pathological ambiguity does) fails instead of running away.
const MAX_CLOSURE_STEPS: usize = 1 << 20;
/// Interned stack nodes per matcher.
const MAX_NODES: usize = 1 << 24;

pub struct Stacks {
    pub prog: Arc<Program>,
    nodes: Vec<(u32, u32)>,
    index: FxHashMap<(u32, u32), u32>,
    work: Vec<Config>,
    seen: rustc_hash::FxHashSet<Config>,
    /// Closure steps taken so far, all calls together (masks budget them).
    pub spent: u64,
}

impl Stacks {
    pub fn new(prog: Arc<Program>) -> Self {
        Stacks {
            prog,
            nodes: Vec::new(),
            index: FxHashMap::default(),
            work: Vec::new(),
            seen: Default::default(),
            spent: 0,
        }
    }

    /// The (return position, rest) of a node.
    #[inline]
    pub fn node(&self, id: u32) -> (u32, u32) {
        self.nodes[id as usize]
    }

    pub fn intern(&mut self, pos: u32, parent: u32) -> Result<u32> {
        if let Some(&id) = self.index.get(&(pos, parent)) {
            return Ok(id);
        }
        if self.nodes.len() >= MAX_NODES {
            return Err(Error::invalid(
                "grammar matcher exceeded its stack memory (pathologically deep or ambiguous grammar)",
            ));
        }
        let id = self.nodes.len() as u32;
        self.nodes.push((pos, parent));
        self.index.insert((pos, parent), id);
        Ok(id)
    }

    /// The initial stacks: every alternative of the root.
    pub fn start(&mut self, out: &mut Vec<Config>) -> Result<()> {
        let prog = Arc::clone(&self.prog);
        for &alt in &prog.rules[prog.root as usize] {
            self.work.push(Config {
                pos: alt,
                sub: 0,
                parent: EMPTY,
            });
        }
        self.close(out)
    }

    /// Queues a stack for the next `close`.
    #[inline]
    pub fn seed(&mut self, c: Config) {
        self.work.push(c);
    }

    /// Expands every queued stack until its top is a terminal (or it has
    /// matched everything, or escaped) and appends those to `out`.
    pub fn close(&mut self, out: &mut Vec<Config>) -> Result<()> {
        self.seen.clear();
        let prog = Arc::clone(&self.prog);
        let mut steps = 0usize;
        while let Some(mut c) = self.work.pop() {
            loop {
                steps += 1;
                self.spent += 1;
                if steps > MAX_CLOSURE_STEPS {
                    self.work.clear();
                    return Err(Error::invalid(
                        "grammar is too ambiguous to match (closure limit reached)",
                    ));
                }
                if c.sub != 0 || c.pos >= ESCAPE {
                    out.push(c);
                    break;
                }
                if !self.seen.insert(c) {
                    break;
                }
                match prog.elems[c.pos as usize] {
                    Elem::Chars(_) | Elem::Token { .. } => {
                        out.push(c);
                        break;
                    }
                    Elem::End => match c.parent {
                        EMPTY => {
                            out.push(Config {
                                pos: ACCEPT,
                                sub: 0,
                                parent: EMPTY,
                            });
                            break;
                        }
                        SYM => {
                            out.push(Config {
                                pos: ESCAPE,
                                sub: 0,
                                parent: SYM,
                            });
                            break;
                        }
                        p => {
                            let (pos, parent) = self.node(p);
                            c = Config {
                                pos,
                                sub: 0,
                                parent,
                            };
                        }
                    },
                    Elem::Rule(r) => {
                        let next = c.pos + 1;
                        // A reference in tail position returns straight to
                        // our caller: loops like `x ::= [a-z] x | ""` keep a
                        // constant stack depth.
                        let ret = if prog.elems[next as usize] == Elem::End {
                            c.parent
                        } else {
                            self.intern(next, c.parent)?
                        };
                        for &alt in &prog.rules[r as usize] {
                            self.work.push(Config {
                                pos: alt,
                                sub: 0,
                                parent: ret,
                            });
                        }
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// Feeds byte `b` to every stack of `set`; the resulting set (closed,
    /// unsorted) is appended to `out`.
    pub fn advance(&mut self, set: &[Config], b: u8, out: &mut Vec<Config>) -> Result<()> {
        let prog = Arc::clone(&self.prog);
        for &c in set {
            if c.pos >= ESCAPE {
                continue;
            }
            if let Elem::Chars(k) = prog.elems[c.pos as usize] {
                match prog.classes[k as usize].step(c.sub, b) {
                    Step::Done => self.work.push(Config {
                        pos: c.pos + 1,
                        sub: 0,
                        parent: c.parent,
                    }),
                    Step::More(sub) => out.push(Config { sub, ..c }),
                    Step::Dead => {}
                }
            }
        }
        self.close(out)
    }

    /// The stacks of `set` whose top is a token reference matching `token`,
    /// advanced past it (appended to `out`, closed).
    pub fn advance_token(
        &mut self,
        set: &[Config],
        token: u32,
        out: &mut Vec<Config>,
    ) -> Result<()> {
        let prog = Arc::clone(&self.prog);
        for &c in set {
            if c.pos >= ESCAPE {
                continue;
            }
            if let Elem::Token { id, negated } = prog.elems[c.pos as usize] {
                if (id == token) != negated {
                    self.work.push(Config {
                        pos: c.pos + 1,
                        sub: 0,
                        parent: c.parent,
                    });
                }
            }
        }
        self.close(out)
    }

    /// The positions of a stack's frames, top first.
    pub fn frames(&self, mut node: u32) -> Vec<u32> {
        let mut out = Vec::new();
        while node != EMPTY && node != SYM {
            let (pos, parent) = self.node(node);
            out.push(pos);
            node = parent;
        }
        out
    }

    /// A node for these frames (top first) above `bottom`.
    pub fn build(&mut self, frames: &[u32], bottom: u32) -> Result<u32> {
        let mut node = bottom;
        for &pos in frames.iter().rev() {
            node = self.intern(pos, node)?;
        }
        Ok(node)
    }
}

/// Sorts and deduplicates a set of stacks in place.
pub fn canonical(set: &mut Vec<Config>) {
    set.sort_unstable();
    set.dedup();
}
