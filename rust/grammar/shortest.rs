//! The shortest way to finish a grammar from a parse state, for generations
//! that must end inside a token budget: the fewest bytes any completion
//! needs, and one such completion. Each rule's shortest derivation is a
//! fixpoint over its alternatives; a stack's shortest completion is the sum
//! over its frames of the shortest rest of each frame's alternative (the
//! frames finish independently, one after the other).

use super::program::{Elem, Program};
use super::stack::{Config, Stacks, ACCEPT, EMPTY, ESCAPE, SYM};
use super::trie::{VocabTrie, NO_TOKEN, ROOT};

/// No finite completion.
pub const INF: u32 = u32::MAX;

/// Expansion steps allowed when spelling out a completion (a guard: with
/// strictly improving best alternatives the spelling always terminates).
const MAX_SPELL_STEPS: usize = 1 << 20;

#[derive(Debug)]
pub struct Table {
    /// Per position: the fewest bytes (a token reference counts 1) that
    /// finish its alternative from there.
    rest: Vec<u32>,
    /// Per rule: the alternative with the shortest derivation.
    best_alt: Vec<Option<u32>>,
}

fn elem_cost(prog: &Program, e: Elem, rule_min: &[u32]) -> u32 {
    match e {
        Elem::Chars(k) => prog
            .classes
            .get(k as usize)
            .and_then(|cl| cl.smallest())
            .map_or(INF, |c| utf8_len(c) as u32),
        Elem::Rule(r) => rule_min.get(r as usize).copied().unwrap_or(INF),
        Elem::Token { .. } => 1,
        Elem::End => 0,
    }
}

fn utf8_len(c: u32) -> usize {
    match c {
        0..=0x7F => 1,
        0x80..=0x7FF => 2,
        0x800..=0xFFFF => 3,
        _ => 4,
    }
}

/// The cost of an alternative's elements from `pos` to its `End`.
fn alt_cost(prog: &Program, pos: u32, rule_min: &[u32]) -> u32 {
    let mut total: u32 = 0;
    let mut p = pos as usize;
    while let Some(&e) = prog.elems.get(p) {
        if e == Elem::End {
            break;
        }
        total = total.saturating_add(elem_cost(prog, e, rule_min));
        p += 1;
    }
    total
}

impl Table {
    pub fn new(prog: &Program) -> Table {
        let n = prog.rules.len();
        let mut rule_min = vec![INF; n];
        let mut best_alt = vec![None; n];
        // Bellman-Ford style: at most one rule's value is finalized per
        // round, so `n + 1` rounds reach the fixpoint.
        for _ in 0..=n {
            let mut changed = false;
            for (r, alts) in prog.rules.iter().enumerate() {
                for &alt in alts {
                    let c = alt_cost(prog, alt, &rule_min);
                    if c < rule_min[r] {
                        rule_min[r] = c;
                        best_alt[r] = Some(alt);
                        changed = true;
                    }
                }
            }
            if !changed {
                break;
            }
        }
        let mut rest = vec![0u32; prog.elems.len()];
        for p in (0..prog.elems.len()).rev() {
            let e = prog.elems[p];
            rest[p] = if e == Elem::End {
                0
            } else {
                let next = rest.get(p + 1).copied().unwrap_or(0);
                elem_cost(prog, e, &rule_min).saturating_add(next)
            };
        }
        Table { rest, best_alt }
    }

    fn rest_at(&self, pos: u32) -> u32 {
        self.rest.get(pos as usize).copied().unwrap_or(INF)
    }

    /// The fewest bytes that finish the grammar from stack `c` (`INF` for a
    /// stack that escaped a cached computation or has no finite way out).
    pub fn stack_min(&self, stacks: &Stacks, c: Config) -> u32 {
        if c.pos == ACCEPT {
            return 0;
        }
        if c.pos >= ESCAPE {
            return INF;
        }
        let mut total = if c.sub != 0 {
            // The bytes still missing from the partial code point, then the
            // rest after it.
            ((c.sub >> 24) & 3).saturating_add(self.rest_at(c.pos + 1))
        } else {
            self.rest_at(c.pos)
        };
        let mut node = c.parent;
        while node != EMPTY {
            if node == SYM {
                return INF;
            }
            let (pos, parent) = stacks.node(node);
            total = total.saturating_add(self.rest_at(pos));
            node = parent;
        }
        total
    }

    /// One shortest completion's bytes from stack `c`, when it starts at a
    /// code point boundary and spells out as text (no token reference);
    /// `None` otherwise.
    pub fn spell(&self, prog: &Program, stacks: &Stacks, c: Config) -> Option<Vec<u8>> {
        if c.pos == ACCEPT {
            return Some(Vec::new());
        }
        if c.sub != 0 || c.pos >= ESCAPE {
            return None;
        }
        let mut frames = vec![c.pos];
        let mut node = c.parent;
        while node != EMPTY {
            if node == SYM {
                return None;
            }
            let (pos, parent) = stacks.node(node);
            frames.push(pos);
            node = parent;
        }
        let mut out = Vec::new();
        let mut steps = 0usize;
        // A work stack of positions to spell, last pushed first.
        let mut work: Vec<u32> = frames.into_iter().rev().collect();
        while let Some(pos) = work.pop() {
            steps += 1;
            if steps > MAX_SPELL_STEPS {
                return None;
            }
            match prog.elems.get(pos as usize).copied()? {
                Elem::End => {}
                Elem::Chars(k) => {
                    let ch = char::from_u32(prog.classes.get(k as usize)?.smallest()?)?;
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                    work.push(pos + 1);
                }
                Elem::Rule(r) => {
                    work.push(pos + 1);
                    work.push(self.best_alt.get(r as usize).copied().flatten()?);
                }
                Elem::Token { .. } => return None,
            }
        }
        Some(out)
    }
}

/// `out[i]`: the fewest vocabulary tokens whose bytes spell `text[i..]`
/// (`INF` where none do), found by walking the trie from every offset.
pub fn segment_counts(trie: &VocabTrie, text: &[u8]) -> Vec<u32> {
    let nodes = trie.nodes();
    let mut out = vec![INF; text.len() + 1];
    out[text.len()] = 0;
    for i in (0..text.len()).rev() {
        let mut node = ROOT as usize;
        let mut best = INF;
        for (k, &b) in text[i..].iter().enumerate() {
            // The child of `node` on byte `b`: children are the preorder
            // range after it, each subtree skipped whole.
            let end = nodes.get(node).map_or(0, |n| n.skip as usize);
            let mut c = node + 1;
            let mut found = None;
            while c < end {
                let Some(n) = nodes.get(c) else { break };
                if n.byte == b {
                    found = Some(c);
                    break;
                }
                c = n.skip as usize;
            }
            let Some(c) = found else { break };
            node = c;
            if nodes[c].token != NO_TOKEN {
                best = best.min(out[i + k + 1].saturating_add(1));
            }
        }
        out[i] = best;
    }
    out
}
