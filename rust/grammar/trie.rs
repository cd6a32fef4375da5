//! The vocabulary as a byte trie, built once per tokenizer and shared by
//! every matcher: a mask walks it once, so tokens with a common prefix share
//! the work of matching that prefix.

/// Children and tokens are stored contiguously per node (node `i`'s
/// children are `child_byte/child_node[first_child[i]..first_child[i + 1]]`,
/// its tokens `tokens[first_token[i]..first_token[i + 1]]`).
#[derive(Debug)]
pub struct VocabTrie {
    first_child: Vec<u32>,
    child_byte: Vec<u8>,
    child_node: Vec<u32>,
    first_token: Vec<u32>,
    tokens: Vec<u32>,
    /// Every token's bytes, also those outside the trie (specials).
    pieces: Vec<Box<[u8]>>,
    /// Tokens that only grammar token references and EOS can produce.
    special: Vec<bool>,
    eog: Vec<u32>,
}

pub const ROOT: u32 = 0;

impl VocabTrie {
    /// `pieces[i]` is token `i`'s bytes; tokens flagged `special` (control
    /// tokens) and empty tokens are not matched by text.
    pub fn new(pieces: Vec<Vec<u8>>, special: Vec<bool>, eog: Vec<u32>) -> Self {
        let n = pieces.len();
        let mut special = special;
        special.resize(n, false);
        let eog: Vec<u32> = eog.into_iter().filter(|&t| (t as usize) < n).collect();
        let mut order: Vec<u32> = (0..n as u32)
            .filter(|&t| !special[t as usize] && !pieces[t as usize].is_empty())
            .collect();
        order.sort_by(|&a, &b| pieces[a as usize].cmp(&pieces[b as usize]));
        // Nodes are numbered in depth-first preorder, the order a mask walks
        // them, so the walk reads every array front to back instead of
        // jumping around memory (breadth-first numbering cost twice as
        // much per node). A node's children and tokens are written when it
        // is numbered; each child entry gets its id when the child is.
        let mut first_child = Vec::new();
        let mut child_byte = Vec::new();
        let mut child_node: Vec<u32> = Vec::new();
        let mut first_token = Vec::new();
        let mut tokens = Vec::new();
        // (depth, range of `order` sharing the prefix, child entry to fill)
        let mut stack = vec![(0usize, 0usize, order.len(), usize::MAX)];
        let mut next_id = 0u32;
        let mut kids = Vec::new();
        while let Some((depth, lo, hi, entry)) = stack.pop() {
            if entry != usize::MAX {
                child_node[entry] = next_id;
            }
            next_id += 1;
            first_token.push(tokens.len() as u32);
            first_child.push(child_byte.len() as u32);
            let mut i = lo;
            // Tokens ending exactly here come first in sorted order.
            while i < hi && pieces[order[i] as usize].len() == depth {
                tokens.push(order[i]);
                i += 1;
            }
            kids.clear();
            while i < hi {
                let b = pieces[order[i] as usize][depth];
                let mut j = i;
                while j < hi && pieces[order[j] as usize][depth] == b {
                    j += 1;
                }
                child_byte.push(b);
                child_node.push(0);
                kids.push((depth + 1, i, j, child_node.len() - 1));
                i = j;
            }
            // Reversed, so the first child is numbered next.
            stack.extend(kids.drain(..).rev());
        }
        first_token.push(tokens.len() as u32);
        first_child.push(child_byte.len() as u32);
        VocabTrie {
            first_child,
            child_byte,
            child_node,
            first_token,
            tokens,
            pieces: pieces.into_iter().map(Vec::into_boxed_slice).collect(),
            special,
            eog,
        }
    }

    pub fn n_vocab(&self) -> usize {
        self.pieces.len()
    }

    pub fn n_nodes(&self) -> usize {
        self.first_token.len() - 1
    }

    #[inline]
    pub fn children(&self, node: u32) -> std::ops::Range<usize> {
        self.first_child[node as usize] as usize..self.first_child[node as usize + 1] as usize
    }

    #[inline]
    pub fn child(&self, i: usize) -> (u8, u32) {
        (self.child_byte[i], self.child_node[i])
    }

    #[inline]
    pub fn tokens_at(&self, node: u32) -> &[u32] {
        &self.tokens
            [self.first_token[node as usize] as usize..self.first_token[node as usize + 1] as usize]
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
