//! The integrity checksum of snapshots and stored KV blocks: XXH3-128 over
//! 1 MiB leaves, then over the leaves' digests.
//!
//! A snapshot's checksum guards against corruption (a flipped bit, a torn
//! write, a truncated copy), not against an adversary: anyone who can write
//! a file can also write its digest, whatever the hash. BLAKE3, which
//! version 1 and 2 files carry, costs 1.5 ms of two cores for a 12.7 MB
//! session on the reference Zen 4, more than llama.cpp's whole
//! `llama_state_set_data`; XXH3 runs near memory speed. A plain XXH3 is a
//! single chain, so the payload is cut into fixed leaves that the shared
//! pool hashes in parallel, and the root hashes their digests seeded with
//! the payload's length:
//!
//! ```text
//! leaf_i = XXH3-128(payload[i MiB .. (i+1) MiB])          (the last may be short)
//! root   = XXH3-128_seed(len)(leaf_0 || leaf_1 || ...)    (each 16 bytes, little-endian)
//! ```
//!
//! An empty payload has no leaves: its root hashes nothing.

use twox_hash::XxHash3_128;

use crate::threadpool::{physical_cores, shared_pool, SharedMut};

/// Bytes per leaf. Part of the format: changing it changes every digest.
pub const LEAF: usize = 1 << 20;

/// Bytes of a digest.
pub const DIGEST_LEN: usize = 16;

/// Below this many leaves one thread hashes them all: a pool dispatch
/// costs more than it saves.
const PARALLEL_MIN_LEAVES: usize = 3;

/// One leaf's digest.
pub fn leaf(data: &[u8]) -> [u8; DIGEST_LEN] {
    XxHash3_128::oneshot(data).to_le_bytes()
}

/// The root over leaf digests, for a payload of `len` bytes.
pub fn root(leaves: &[[u8; DIGEST_LEN]], len: usize) -> [u8; DIGEST_LEN] {
    XxHash3_128::oneshot_with_seed(len as u64, leaves.as_flattened()).to_le_bytes()
}

/// The checksum of `data`.
pub fn digest(data: &[u8]) -> [u8; DIGEST_LEN] {
    digest_beside(data, || {})
}

/// The checksum of `data`, with `side` run in the same pool dispatch: the
/// first thread free takes `side` (a save's write to its file), the others
/// hash, and whoever finishes `side` joins the hashing.
pub fn digest_beside(data: &[u8], side: impl Fn() + Sync) -> [u8; DIGEST_LEN] {
    let n = data.len().div_ceil(LEAF);
    let mut leaves = vec![[0u8; DIGEST_LEN]; n];
    let threads = if n < PARALLEL_MIN_LEAVES {
        1
    } else {
        physical_cores()
    };
    if threads < 2 {
        side();
        for (d, chunk) in leaves.iter_mut().zip(data.chunks(LEAF)) {
            *d = leaf(chunk);
        }
        return root(&leaves, data.len());
    }
    let out = SharedMut::new(&mut leaves);
    // Job 0 is `side`: jobs are claimed in order, so it starts first.
    shared_pool(threads).run(n + 1, |j| {
        if j == 0 {
            side();
            return;
        }
        let i = j - 1;
        let end = ((i + 1) * LEAF).min(data.len());
        let d = leaf(&data[i * LEAF..end]);
        // SAFETY: job i writes only slot i, and `leaves` outlives the run.
        unsafe { out.slice(i, 1)[0] = d };
    });
    root(&leaves, data.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, one leaf after another on this thread.
    fn serial(data: &[u8]) -> [u8; DIGEST_LEN] {
        let leaves: Vec<_> = data.chunks(LEAF).map(leaf).collect();
        root(&leaves, data.len())
    }

    #[test]
    fn parallel_equals_the_definition_for_many_sizes() {
        let data: Vec<u8> = (0..9 * LEAF + 4097).map(|i| (i * 31 % 251) as u8).collect();
        for len in [
            0,
            1,
            240,
            241,
            LEAF - 1,
            LEAF,
            LEAF + 1,
            3 * LEAF,
            3 * LEAF + 7,
            9 * LEAF + 4097,
        ] {
            assert_eq!(digest(&data[..len]), serial(&data[..len]), "len {len}");
        }
    }

    #[test]
    fn every_byte_and_the_length_count() {
        let mut data: Vec<u8> = (0..3 * LEAF + 5).map(|i| (i * 7 % 253) as u8).collect();
        let base = digest(&data);
        for pos in [0, LEAF - 1, LEAF, 2 * LEAF + 3, data.len() - 1] {
            data[pos] ^= 1;
            assert_ne!(digest(&data), base, "flip at {pos}");
            data[pos] ^= 1;
        }
        assert_ne!(digest(&data[..data.len() - 1]), base);
        // Zero bytes appended: same leaves' prefix, other length and leaf.
        let mut longer = data.clone();
        longer.push(0);
        assert_ne!(digest(&longer), base);
    }

    #[test]
    fn side_runs_once() {
        let data = vec![5u8; 4 * LEAF];
        let runs = std::sync::atomic::AtomicUsize::new(0);
        let d = digest_beside(&data, || {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        assert_eq!(runs.into_inner(), 1);
        assert_eq!(d, serial(&data));
    }
}
