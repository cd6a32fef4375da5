//! Grammar-constrained decoding: a pushdown matcher over UTF-8 bytes for
//! grammars compiled by `oxillama.grammar` (GBNF, JSON Schema), and the
//! per-token masks it computes against a byte trie of the vocabulary.

mod mask;
mod matcher;
mod program;
mod shortest;
mod stack;
mod trie;
mod utf8;

pub use matcher::{LocalCache, Matcher};
pub use program::Program;
pub use trie::VocabTrie;

#[cfg(test)]
mod tests;
