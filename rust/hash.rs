//! BLAKE3 of large buffers on the shared thread pool.
//!
//! Version 1 and 2 snapshots carry a BLAKE3 of tens of megabytes (newer
//! ones a cheaper checksum, `crate::checksum`); model fingerprints hash
//! megabytes too. One core hashes about 1.6 GB/s on the reference machine. BLAKE3 is a tree hash,
//! so we split the input exactly as the tree does (the left subtree is the
//! largest power-of-two number of chunks below the whole), hash the leaves
//! as chaining values on the pool, and merge them back up. The result is
//! bit-for-bit `blake3::hash` (tested), just parallel.

use blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};
use blake3::CHUNK_LEN;

use crate::threadpool::{physical_cores, shared_pool, SharedMut};

/// Below this, one thread hashes the whole input.
const PARALLEL_MIN: usize = 1 << 20;

enum Node {
    Leaf(usize),
    Parent(Box<Node>, Box<Node>),
}

/// Splits `len` bytes at `offset` into the BLAKE3 tree down to leaves of at
/// most `leaf_max` bytes, pushing leaf ranges in input order.
fn split(offset: usize, len: usize, leaf_max: usize, leaves: &mut Vec<(usize, usize)>) -> Node {
    if len <= leaf_max || len <= CHUNK_LEN {
        leaves.push((offset, len));
        return Node::Leaf(leaves.len() - 1);
    }
    // `left_subtree_len` returns a u64 no larger than `len`, which is a usize.
    let left = left_subtree_len(len as u64) as usize;
    let l = split(offset, left, leaf_max, leaves);
    let r = split(offset + left, len - left, leaf_max, leaves);
    Node::Parent(Box::new(l), Box::new(r))
}

fn merge(node: &Node, cvs: &[ChainingValue]) -> ChainingValue {
    match node {
        Node::Leaf(i) => cvs[*i],
        Node::Parent(l, r) => merge_subtrees_non_root(&merge(l, cvs), &merge(r, cvs), Mode::Hash),
    }
}

/// `blake3::hash(data)`, computed on the shared pool for large inputs
/// (model fingerprints, adapters, the prefix store's keys).
pub fn hash(data: &[u8]) -> blake3::Hash {
    // Small inputs hash on this thread; the core count (/proc and cgroup
    // reads, ~0.1 ms) is only asked for when the pool may be used.
    let threads = if data.len() < PARALLEL_MIN {
        1
    } else {
        physical_cores()
    };
    if threads < 2 {
        return blake3::hash(data);
    }
    let leaf_max = (data.len() / (4 * threads)).max(PARALLEL_MIN / 4);
    let mut leaves = Vec::new();
    let root = split(0, data.len(), leaf_max, &mut leaves);
    let mut cvs = vec![[0u8; 32]; leaves.len()];
    let out = SharedMut::new(&mut cvs);
    shared_pool(threads).run(leaves.len(), |i| {
        let (off, len) = leaves[i];
        let cv = blake3::Hasher::new()
            .set_input_offset(off as u64)
            .update(&data[off..off + len])
            .finalize_non_root();
        // SAFETY: leaf i writes only slot i.
        unsafe { out.slice(i, 1)[0] = cv };
    });
    match &root {
        Node::Parent(l, r) => merge_subtrees_root(&merge(l, &cvs), &merge(r, &cvs), Mode::Hash),
        // A single leaf only happens below PARALLEL_MIN, handled above.
        Node::Leaf(_) => blake3::hash(data),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equals_the_serial_hash_for_many_sizes() {
        let data: Vec<u8> = (0..(9usize << 20) + 4097)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        for len in [
            0,
            1,
            1024,
            1025,
            PARALLEL_MIN - 1,
            PARALLEL_MIN,
            PARALLEL_MIN + 1,
            3 << 20,
            (3 << 20) + 1023,
            5 << 20,
            (9 << 20) + 4097,
        ] {
            assert_eq!(hash(&data[..len]), blake3::hash(&data[..len]), "len {len}");
        }
    }
}
