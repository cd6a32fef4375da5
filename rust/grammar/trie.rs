//! The vocabulary as a byte trie, built once per tokenizer and shared by
//! every matcher: a mask walks it once, so tokens with a common prefix share
//! the work of matching that prefix.

/// One trie node, stored in depth-first preorder. A subtree is the range
/// `i + 1..skip`, so a walk is a forward scan that jumps over dead
/// subtrees, with no explicit stack of child ranges: the scan reads the
/// array front to back, and its only data-dependent branch is "is this
/// prefix still alive". (A child-list walk with a frame stack cost about
/// 25 ns per node here, mostly mispredicted branches and frame traffic.)
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct Node {
    /// One past the last node of this node's subtree.
    pub skip: u32,
    /// The token whose bytes end here, `NO_TOKEN` if none; `MANY` marks a
    /// node several tokens end at (duplicate pieces, listed in `extra`).
    pub token: u32,
    /// Depth (bytes from the root).
    pub depth: u16,
    /// The byte on the edge into this node (0 for the root).
    pub byte: u8,
}

pub const NO_TOKEN: u32 = u32::MAX;
pub const MANY: u32 = u32::MAX - 1;
pub const ROOT: u32 = 0;
/// Pieces longer than this are not matched by text (depth is a u16; no
/// real vocabulary comes near it).
const MAX_PIECE: usize = u16::MAX as usize;

#[derive(Debug)]
pub struct VocabTrie {
    nodes: Vec<Node>,
    max_depth: usize,
    /// `(node, token)` for nodes marked `MANY`, sorted by node.
    extra: Vec<(u32, u32)>,
    /// Every token's bytes, also those outside the trie (specials).
    pieces: Vec<Box<[u8]>>,
    /// Tokens that only grammar token references and EOS can produce.
    special: Vec<bool>,
    eog: Vec<u32>,
}

impl VocabTrie {
    /// `pieces[i]` is token `i`'s bytes; tokens flagged `special` (control
    /// tokens) and empty tokens are not matched by text.
    pub fn new(pieces: Vec<Vec<u8>>, special: Vec<bool>, eog: Vec<u32>) -> Self {
        let n = pieces.len();
        let mut special = special;
        special.resize(n, false);
        let eog: Vec<u32> = eog.into_iter().filter(|&t| (t as usize) < n).collect();
        let mut order: Vec<u32> = (0..n as u32)
            .filter(|&t| {
                let p = &pieces[t as usize];
                !special[t as usize] && !p.is_empty() && p.len() <= MAX_PIECE
            })
            .collect();
        order.sort_by(|&a, &b| pieces[a as usize].cmp(&pieces[b as usize]));
        // In sorted order a preorder numbering is one pass: each piece adds
        // the nodes for the bytes beyond its common prefix with the previous
        // piece. `open[d]` is the node at depth d on the current path; a node
        // is closed (its skip written) when the path leaves it.
        let mut nodes = vec![Node {
            skip: 0,
            token: NO_TOKEN,
            depth: 0,
            byte: 0,
        }];
        let mut extra = Vec::new();
        let mut open: Vec<u32> = vec![ROOT];
        let mut prev: &[u8] = &[];
        for &t in &order {
            let p = &pieces[t as usize][..];
            let common = p.iter().zip(prev).take_while(|(a, b)| a == b).count();
            // Close the nodes below the shared prefix.
            while open.len() > common + 1 {
                if let Some(closed) = open.pop() {
                    nodes[closed as usize].skip = nodes.len() as u32;
                }
            }
            for (d, &b) in p.iter().enumerate().skip(common) {
                open.push(nodes.len() as u32);
                nodes.push(Node {
                    skip: 0,
                    token: NO_TOKEN,
                    depth: (d + 1) as u16,
                    byte: b,
                });
            }
            let last = open.last().copied().unwrap_or(ROOT) as usize;
            match nodes[last].token {
                NO_TOKEN => nodes[last].token = t,
                MANY => extra.push((last as u32, t)),
                first => {
                    extra.push((last as u32, first));
                    extra.push((last as u32, t));
                    nodes[last].token = MANY;
                }
            }
            prev = p;
        }
        let end = nodes.len() as u32;
        for closed in open {
            nodes[closed as usize].skip = end;
        }
        extra.sort_unstable();
        let max_depth = nodes.iter().map(|n| n.depth as usize).max().unwrap_or(0);
        VocabTrie {
            nodes,
            max_depth,
            extra,
            pieces: pieces.into_iter().map(Vec::into_boxed_slice).collect(),
            special,
            eog,
        }
    }

    pub fn n_vocab(&self) -> usize {
        self.pieces.len()
    }

    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// The longest piece in the trie, in bytes.
    pub fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// All nodes in preorder (see `Node`).
    #[inline]
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The tokens of a node marked `MANY`.
    pub fn many_tokens(&self, node: u32) -> impl Iterator<Item = u32> + '_ {
        let lo = self.extra.partition_point(|&(n, _)| n < node);
        self.extra[lo..]
            .iter()
            .take_while(move |&&(n, _)| n == node)
            .map(|&(_, t)| t)
    }

    pub fn piece(&self, token: u32) -> Option<&[u8]> {
        self.pieces.get(token as usize).map(|p| &p[..])
    }

    pub fn is_special(&self, token: u32) -> bool {
        self.special.get(token as usize).copied().unwrap_or(true)
    }

    pub fn eog(&self) -> &[u32] {
        &self.eog
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rebuilds every piece from the preorder array and checks the skips
    /// delimit exactly each node's descendants.
    #[test]
    fn preorder_layout_spells_every_piece() {
        let words: Vec<&[u8]> = vec![
            b"a", b"ab", b"abc", b"abd", b"b", b"ba", b"ab", b"", b"zzz", b"abc",
        ];
        let pieces: Vec<Vec<u8>> = words.iter().map(|w| w.to_vec()).collect();
        let trie = VocabTrie::new(pieces.clone(), vec![false; pieces.len()], vec![]);
        let nodes = trie.nodes();
        let mut path: Vec<u8> = Vec::new();
        let mut found: Vec<(Vec<u8>, u32)> = Vec::new();
        for (i, n) in nodes.iter().enumerate().skip(1) {
            path.truncate(n.depth as usize - 1);
            path.push(n.byte);
            assert!(n.skip as usize > i && n.skip as usize <= nodes.len());
            for (j, inner) in nodes[i + 1..n.skip as usize].iter().enumerate() {
                assert!(
                    inner.depth > n.depth,
                    "node {} is inside {i}'s skip",
                    i + 1 + j
                );
            }
            if let Some(next) = nodes.get(n.skip as usize) {
                assert!(next.depth <= n.depth);
            }
            match n.token {
                NO_TOKEN => {}
                MANY => found.extend(trie.many_tokens(i as u32).map(|t| (path.clone(), t))),
                t => found.push((path.clone(), t)),
            }
        }
        found.sort_by_key(|f| f.1);
        let want: Vec<(Vec<u8>, u32)> = pieces
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.is_empty())
            .map(|(t, p)| (p.clone(), t as u32))
            .collect();
        assert_eq!(found, want);
        assert_eq!(nodes[0].skip as usize, nodes.len());
    }
}
