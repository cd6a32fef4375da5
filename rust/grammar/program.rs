//! The compiled grammar the matcher runs, decoded from the flat `u32`
//! program `oxillama.grammar.compile` writes. The program may come from any
//! caller of the extension, so every count and index is checked.

use super::utf8::CharClass;
use crate::{Error, Result};

/// One grammar element. Each alternative is a run of elements ending in
/// `End`; a position is an index into `Program::elems`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    /// A code point from `Program::classes[i]`.
    Chars(u32),
    /// A reference to rule `r`.
    Rule(u32),
    /// A whole token `id`, or with `negated` any token but `id`.
    Token {
        id: u32,
        negated: bool,
    },
    End,
}

#[derive(Debug)]
pub struct Program {
    pub elems: Vec<Elem>,
    pub classes: Vec<CharClass>,
    /// Per rule, the start position of each alternative.
    pub rules: Vec<Vec<u32>>,
    pub root: u32,
}

/// Elements beyond this are refused (the Python compiler stops at 1M).
const MAX_ELEMS: usize = 4_000_000;

struct Reader<'a> {
    words: &'a [u32],
    at: usize,
}

impl Reader<'_> {
    fn next(&mut self, what: &str) -> Result<u32> {
        let w = self.words.get(self.at).copied().ok_or_else(|| {
            Error::invalid(format!(
                "grammar program truncated at word {} reading {what}",
                self.at
            ))
        })?;
        self.at += 1;
        Ok(w)
    }

    /// A count that must fit in what is left of the program (each counted
    /// item takes at least `min_words`).
    fn count(&mut self, what: &str, min_words: usize) -> Result<usize> {
        let n = self.next(what)? as usize;
        let left = self.words.len() - self.at;
        if n.saturating_mul(min_words) > left {
            return Err(Error::invalid(format!(
                "grammar program claims {n} {what} with only {left} words left"
            )));
        }
        Ok(n)
    }
}

impl Program {
    pub fn decode(words: &[u32]) -> Result<Program> {
        let mut r = Reader { words, at: 0 };
        let n_rules = r.count("rules", 1)?;
        if n_rules == 0 {
            return Err(Error::invalid("grammar program has no rules"));
        }
        let root = r.next("root")?;
        if root as usize >= n_rules {
            return Err(Error::invalid(format!(
                "grammar root {root} is not one of its {n_rules} rules"
            )));
        }
        let mut p = Program {
            elems: Vec::new(),
            classes: Vec::new(),
            rules: Vec::with_capacity(n_rules),
            root,
        };
        for _ in 0..n_rules {
            let n_alts = r.count("alternatives", 1)?;
            let mut alts = Vec::with_capacity(n_alts);
            for _ in 0..n_alts {
                alts.push(p.elems.len() as u32);
                let n_elems = r.count("elements", 2)?;
                for _ in 0..n_elems {
                    let e = match r.next("element kind")? {
                        0 => {
                            let n = r.count("ranges", 2)?;
                            let mut ranges = Vec::with_capacity(n);
                            for _ in 0..n {
                                let (lo, hi) = (r.next("range")?, r.next("range")?);
                                if lo > hi || hi > 0x10_FFFF {
                                    return Err(Error::invalid(format!(
                                        "bad code point range {lo:#x}-{hi:#x}"
                                    )));
                                }
                                ranges.push((lo, hi));
                            }
                            p.classes.push(CharClass::new(ranges));
                            Elem::Chars(p.classes.len() as u32 - 1)
                        }
                        1 => {
                            let rule = r.next("rule reference")?;
                            if rule as usize >= n_rules {
                                return Err(Error::invalid(format!(
                                    "reference to rule {rule} of {n_rules}"
                                )));
                            }
                            Elem::Rule(rule)
                        }
                        2 => {
                            let negated = r.next("token flag")? != 0;
                            Elem::Token {
                                id: r.next("token id")?,
                                negated,
                            }
                        }
                        k => return Err(Error::invalid(format!("unknown element kind {k}"))),
                    };
                    p.elems.push(e);
                }
                p.elems.push(Elem::End);
                if p.elems.len() > MAX_ELEMS {
                    return Err(Error::invalid("grammar program is too large"));
                }
            }
            p.rules.push(alts);
        }
        if r.at != words.len() {
            return Err(Error::invalid(format!(
                "{} words after the end of the grammar program",
                words.len() - r.at
            )));
        }
        Ok(p)
    }
}
