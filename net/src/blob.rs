//! Content-addressed blobs: the hash, the chunk list and chunk verification.
//!
//! A blob is named by `blake3(bytes)`, the hash the protocol layer announces. To verify each
//! ~1 MiB chunk on arrival (not only the whole blob at the end) we use the BLAKE3 tree
//! itself, the idea behind Bao: a [`ChunkList`] lists the chaining value of every 1 MiB
//! subtree; merging them up the tree must give the blob hash, so a chunk list from any peer is
//! checked before use, and each chunk is then checked against its chaining value. A lying
//! source is caught on the first bad chunk. The chunk list costs 32 bytes per MiB.

pub mod fetch;
pub mod store;
pub mod wire;

use std::fmt;
use std::ops::Range;

use blake3::hazmat::{
    merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};
use serde::{Deserialize, Serialize};

/// Size of one transfer chunk: one aligned BLAKE3 subtree of 1024 chunks of 1 KiB.
pub const CHUNK_SIZE: usize = 1 << 20;
/// Largest blob the layer moves (4 GiB): bounds chunk lists and allocations from the wire.
pub const MAX_BLOB_SIZE: u64 = 4 << 30;
/// Most chunks in a chunk list, implied by [`MAX_BLOB_SIZE`].
pub const MAX_CHUNKS: usize = (MAX_BLOB_SIZE / CHUNK_SIZE as u64) as usize;

/// The blake3 hash of a blob's bytes: its name everywhere in atoll.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BlobHash(pub [u8; 32]);

impl BlobHash {
    /// Hash of `bytes` (equal to `blake3::hash(bytes)`).
    pub fn of(bytes: &[u8]) -> Self {
        BlobHash(*blake3::hash(bytes).as_bytes())
    }

    /// Lower-case hex, 64 characters.
    pub fn to_hex(&self) -> String {
        blake3::Hash::from_bytes(self.0).to_hex().to_string()
    }

    /// Parses 64 hex characters.
    pub fn from_hex(s: &str) -> Option<Self> {
        blake3::Hash::from_hex(s).ok().map(|h| BlobHash(*h.as_bytes()))
    }
}

impl fmt::Display for BlobHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for BlobHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlobHash({})", &self.to_hex()[..12])
    }
}

/// Number of chunks of a blob of `size` bytes (an empty blob is one empty chunk).
pub fn chunk_count(size: u64) -> usize {
    (size.div_ceil(CHUNK_SIZE as u64)).max(1) as usize
}

/// Byte range of chunk `index` in a blob of `size` bytes.
pub fn chunk_range(size: u64, index: usize) -> Range<u64> {
    let start = (index as u64 * CHUNK_SIZE as u64).min(size);
    let end = (start + CHUNK_SIZE as u64).min(size);
    start..end
}

/// Per-chunk chaining values of a blob; verifiable against the blob hash.
///
/// For a one-chunk blob the single entry is the blob hash itself (a lone chunk is the root).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkList {
    /// Blob size in bytes.
    pub size: u64,
    /// One chaining value per chunk, in order.
    pub chunk_cvs: Vec<[u8; 32]>,
}

impl ChunkList {
    /// Computes the chunk list of `data` (one pass of hashing).
    pub fn compute(data: &[u8]) -> ChunkList {
        let size = data.len() as u64;
        let n = chunk_count(size);
        let chunk_cvs = if n == 1 {
            vec![*blake3::hash(data).as_bytes()]
        } else {
            (0..n).map(|i| chunk_cv(i, &data[range_usize(size, i)])).collect()
        };
        ChunkList { size, chunk_cvs }
    }

    /// Number of chunks.
    pub fn chunk_count(&self) -> usize {
        self.chunk_cvs.len()
    }

    /// The blob hash this chunk list names (its tree root), or `None` if it is malformed.
    /// Equal to `blake3::hash` of the blob, computed from the chaining values alone.
    pub fn root(&self) -> Option<BlobHash> {
        if self.size > MAX_BLOB_SIZE || self.chunk_cvs.len() != chunk_count(self.size) {
            return None;
        }
        if self.chunk_cvs.len() == 1 {
            return Some(BlobHash(self.chunk_cvs[0]));
        }
        let (left, right) = self.chunk_cvs.split_at(left_len(self.chunk_cvs.len()));
        let root = merge_subtrees_root(&subtree_cv(left), &subtree_cv(right), Mode::Hash);
        Some(BlobHash(*root.as_bytes()))
    }

    /// True when the chunk list is well-formed and its tree root equals `hash`.
    pub fn verify(&self, hash: &BlobHash) -> bool {
        self.root() == Some(*hash)
    }

    /// True when `bytes` are exactly chunk `index` of the blob this (verified) chunk list names.
    pub fn verify_chunk(&self, index: usize, bytes: &[u8]) -> bool {
        let Some(expected) = self.chunk_cvs.get(index) else {
            return false;
        };
        let range = chunk_range(self.size, index);
        if bytes.len() as u64 != range.end - range.start {
            return false;
        }
        if self.chunk_cvs.len() == 1 {
            return blake3::hash(bytes).as_bytes() == expected;
        }
        &chunk_cv(index, bytes) == expected
    }
}

fn range_usize(size: u64, index: usize) -> Range<usize> {
    let r = chunk_range(size, index);
    r.start as usize..r.end as usize
}

/// Non-root chaining value of chunk `index` (only valid in a blob of two or more chunks).
fn chunk_cv(index: usize, bytes: &[u8]) -> ChainingValue {
    let mut hasher = blake3::Hasher::new();
    hasher.set_input_offset(index as u64 * CHUNK_SIZE as u64);
    hasher.update(bytes);
    hasher.finalize_non_root()
}

/// BLAKE3 puts the largest power of two of whole chunks that leaves something on the right
/// into the left subtree; with 1 MiB aligned chunks that is the largest power of two < n.
fn left_len(n: usize) -> usize {
    debug_assert!(n >= 2);
    1 << (usize::BITS - 1 - (n - 1).leading_zeros())
}

fn subtree_cv(cvs: &[[u8; 32]]) -> ChainingValue {
    if cvs.len() == 1 {
        return cvs[0];
    }
    let (left, right) = cvs.split_at(left_len(cvs.len()));
    merge_subtrees_non_root(&subtree_cv(left), &subtree_cv(right), Mode::Hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Non-periodic bytes (a periodic pattern would make chunks equal to each other).
    fn data(len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        blake3::Hasher::new().update(b"atoll test data").finalize_xof().fill(&mut v);
        v
    }

    #[test]
    fn chunk_list_root_equals_blake3_at_boundaries() {
        let c = CHUNK_SIZE;
        for len in [0, 1, c - 1, c, c + 1, 2 * c, 3 * c + 7, 4 * c, 5 * c - 1] {
            let d = data(len);
            let m = ChunkList::compute(&d);
            let h = BlobHash::of(&d);
            assert_eq!(m.chunk_count(), chunk_count(len as u64), "len {len}");
            assert!(m.verify(&h), "chunk list does not verify for len {len}");
            assert_eq!(m.root(), Some(h));
            for i in 0..m.chunk_count() {
                assert!(m.verify_chunk(i, &d[range_usize(len as u64, i)]), "len {len} chunk {i}");
            }
        }
    }

    #[test]
    fn tampered_chunk_list_and_chunks_fail() {
        let d = data(3 * CHUNK_SIZE + 5);
        let h = BlobHash::of(&d);
        let m = ChunkList::compute(&d);
        let mut bad = m.clone();
        bad.chunk_cvs[1][0] ^= 1;
        assert!(!bad.verify(&h));
        let mut short = m.clone();
        short.chunk_cvs.pop();
        assert!(!short.verify(&h));
        let mut chunk = d[range_usize(d.len() as u64, 2)].to_vec();
        chunk[100] ^= 0x80;
        assert!(!m.verify_chunk(2, &chunk));
        assert!(!m.verify_chunk(2, &chunk[1..]));
        assert!(!m.verify_chunk(9, &chunk));
        // A chunk moved to another index does not verify (the offset is in the hash).
        assert!(!m.verify_chunk(1, &d[range_usize(d.len() as u64, 0)]));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(12))]
        /// Split into chunks, verify each, reassemble: the same bytes and the blake3 root.
        #[test]
        fn split_verify_reassemble(len in 0usize..(3 * CHUNK_SIZE + CHUNK_SIZE / 2)) {
            let d = data(len);
            let m = ChunkList::compute(&d);
            proptest::prop_assert_eq!(m.root(), Some(BlobHash::of(&d)));
            let mut out = Vec::with_capacity(len);
            for i in 0..m.chunk_count() {
                let chunk = &d[range_usize(len as u64, i)];
                proptest::prop_assert!(m.verify_chunk(i, chunk));
                out.extend_from_slice(chunk);
            }
            proptest::prop_assert_eq!(out, d);
        }
    }

    #[test]
    fn hex_round_trip() {
        let h = BlobHash::of(b"atoll");
        assert_eq!(BlobHash::from_hex(&h.to_hex()), Some(h));
        assert_eq!(BlobHash::from_hex("zz"), None);
    }
}
