//! The local blob store: an in-memory, size-budgeted, least-recently-used map.
//!
//! Why memory and not disk: blobs here are deltas and anchor fragments (megabytes) that are
//! served for a few rounds and then superseded; the trainer keeps its own checkpoints on disk.
//! The budget bounds memory; the least recently used blob goes first.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;

use super::{BlobHash, ChunkList, MAX_BLOB_SIZE};
use crate::error::StoreError;

/// Default budget: 1 GiB.
pub const DEFAULT_STORE_BUDGET: u64 = 1 << 30;

struct Entry {
    data: Bytes,
    chunk_list: Arc<ChunkList>,
    /// Tick of the last use; the key of this entry in `BlobStore::by_use`.
    last_used: u64,
}

/// Blobs by hash, with their chunk lists, under a byte budget.
pub struct BlobStore {
    budget: u64,
    used: u64,
    /// Monotonic use counter (not a clock: deterministic and cheap).
    tick: u64,
    entries: HashMap<BlobHash, Entry>,
    /// Least recently used first; pinned blobs are not in it, so never evicted.
    by_use: BTreeMap<u64, BlobHash>,
    pinned: HashSet<BlobHash>,
    /// Bytes of the pinned blobs: at most half the budget, so the rest still turns over.
    pinned_bytes: u64,
    /// Size of the largest blob held (the uploads' fair share is a multiple of it).
    largest: u64,
}

impl BlobStore {
    /// An empty store that holds at most `budget` bytes of blob data.
    pub fn new(budget: u64) -> Self {
        BlobStore {
            budget,
            used: 0,
            tick: 0,
            entries: HashMap::new(),
            by_use: BTreeMap::new(),
            pinned: HashSet::new(),
            pinned_bytes: 0,
            largest: 0,
        }
    }

    /// Stores `data` under its precomputed hash and chunk list, evicting older blobs as needed.
    /// Returns the hashes evicted.
    pub fn insert(
        &mut self,
        hash: BlobHash,
        data: Bytes,
        chunk_list: Arc<ChunkList>,
    ) -> Result<Vec<BlobHash>, StoreError> {
        let size = data.len() as u64;
        if size > MAX_BLOB_SIZE {
            return Err(StoreError::OverMaxBlobSize { size, max: MAX_BLOB_SIZE });
        }
        // Evicting every unpinned blob makes room for anything up to what pins leave.
        let room = self.budget - self.pinned_bytes;
        if size > room {
            return Err(StoreError::TooLarge { size, budget: room });
        }
        if self.entries.contains_key(&hash) {
            self.touch(&hash);
            return Ok(Vec::new());
        }
        let mut evicted = Vec::new();
        while self.used + size > self.budget {
            let Some((_, oldest)) = self.by_use.pop_first() else {
                break;
            };
            if let Some(e) = self.entries.remove(&oldest) {
                self.used -= e.data.len() as u64;
            }
            evicted.push(oldest);
        }
        if !evicted.is_empty() {
            self.recompute_largest();
        }
        self.largest = self.largest.max(size);
        self.tick += 1;
        self.by_use.insert(self.tick, hash);
        self.entries.insert(hash, Entry { data, chunk_list, last_used: self.tick });
        self.used += size;
        Ok(evicted)
    }

    /// The blob and its chunk list, marking it recently used.
    pub fn get(&mut self, hash: &BlobHash) -> Option<(Bytes, Arc<ChunkList>)> {
        self.touch(hash);
        self.entries.get(hash).map(|e| (e.data.clone(), e.chunk_list.clone()))
    }

    /// True if the blob is stored.
    pub fn contains(&self, hash: &BlobHash) -> bool {
        self.entries.contains_key(hash)
    }

    /// Removes a blob; true if it was there.
    pub fn remove(&mut self, hash: &BlobHash) -> bool {
        match self.entries.remove(hash) {
            Some(e) => {
                self.by_use.remove(&e.last_used);
                if self.pinned.remove(hash) {
                    self.pinned_bytes -= e.data.len() as u64;
                }
                self.used -= e.data.len() as u64;
                if e.data.len() as u64 >= self.largest {
                    self.recompute_largest();
                }
                true
            }
            None => false,
        }
    }

    /// Keeps a stored blob from eviction until [`BlobStore::unpin`]: a peer's own payloads
    /// must stay servable while others may still ask for them, however much it fetches
    /// meanwhile. False when the blob is not here, or pinning it would hold more than half
    /// the budget.
    pub fn pin(&mut self, hash: &BlobHash) -> bool {
        if self.pinned.contains(hash) {
            return true;
        }
        let Some(e) = self.entries.get(hash) else { return false };
        let size = e.data.len() as u64;
        if self.pinned_bytes + size > self.budget / 2 {
            return false;
        }
        self.by_use.remove(&e.last_used);
        self.pinned.insert(*hash);
        self.pinned_bytes += size;
        true
    }

    /// Lets a pinned blob be evicted again (as recently used as when last read).
    pub fn unpin(&mut self, hash: &BlobHash) {
        if !self.pinned.remove(hash) {
            return;
        }
        if let Some(e) = self.entries.get(hash) {
            self.pinned_bytes -= e.data.len() as u64;
            self.by_use.insert(e.last_used, *hash);
        }
    }

    /// Number of blobs stored.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if no blob is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of blob data stored.
    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    /// Size of the largest blob held (0 when empty).
    pub fn largest_bytes(&self) -> u64 {
        self.largest
    }

    /// A scan, but only when the largest blob may have left: puts and evictions are rare
    /// next to the chunk requests that read [`BlobStore::largest_bytes`].
    fn recompute_largest(&mut self) {
        self.largest = self.entries.values().map(|e| e.data.len() as u64).max().unwrap_or(0);
    }

    fn touch(&mut self, hash: &BlobHash) {
        if let Some(e) = self.entries.get_mut(hash) {
            self.by_use.remove(&e.last_used);
            self.tick += 1;
            e.last_used = self.tick;
            if !self.pinned.contains(hash) {
                self.by_use.insert(self.tick, *hash);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(store: &mut BlobStore, bytes: &[u8]) -> (BlobHash, Vec<BlobHash>) {
        let h = BlobHash::of(bytes);
        let m = Arc::new(ChunkList::compute(bytes));
        let ev = store.insert(h, Bytes::copy_from_slice(bytes), m).unwrap();
        (h, ev)
    }

    #[test]
    fn evicts_least_recently_used_within_budget() {
        let mut s = BlobStore::new(100);
        let (a, _) = put(&mut s, &[1; 40]);
        let (b, _) = put(&mut s, &[2; 40]);
        assert!(s.get(&a).is_some()); // a is now more recent than b
        let (c, ev) = put(&mut s, &[3; 40]);
        assert_eq!(ev, vec![b]);
        assert!(s.contains(&a) && s.contains(&c) && !s.contains(&b));
        assert_eq!(s.used_bytes(), 80);
        assert_eq!(s.largest_bytes(), 40);
        assert!(s.used_bytes() <= 100);
    }

    #[test]
    fn rejects_blob_over_budget_and_handles_duplicates() {
        let mut s = BlobStore::new(10);
        let data = [0u8; 11];
        let err = s
            .insert(
                BlobHash::of(&data),
                Bytes::copy_from_slice(&data),
                Arc::new(ChunkList::compute(&data)),
            )
            .unwrap_err();
        assert!(matches!(err, StoreError::TooLarge { .. }));
        let (a, _) = put(&mut s, &[1; 5]);
        let (a2, ev) = put(&mut s, &[1; 5]);
        assert_eq!(a, a2);
        assert!(ev.is_empty());
        assert_eq!(s.used_bytes(), 5);
        assert_eq!(s.largest_bytes(), 5);
        assert!(s.remove(&a));
        assert!(s.is_empty());
        assert_eq!(s.largest_bytes(), 0);
        assert_eq!(s.used_bytes(), 0);
    }

    #[test]
    fn pinned_blobs_outlive_eviction_up_to_half_the_budget() {
        let mut s = BlobStore::new(100);
        let (a, _) = put(&mut s, &[1; 30]);
        let (b, _) = put(&mut s, &[2; 30]);
        assert!(s.pin(&a));
        assert!(!s.pin(&b), "pins may hold at most half the budget");
        assert!(!s.pin(&BlobHash::of(b"absent")));
        // Reading a pinned blob does not put it back in line for eviction.
        assert!(s.get(&a).is_some());
        let (c, ev) = put(&mut s, &[3; 45]);
        let (d, ev2) = put(&mut s, &[4; 30]);
        assert_eq!((ev, ev2), (vec![b], vec![c]));
        assert!(s.contains(&a) && s.contains(&d));
        // What pins hold is not room for a new blob.
        let err = s.insert(
            BlobHash::of(&[5; 71]),
            Bytes::copy_from_slice(&[5; 71]),
            Arc::new(ChunkList::compute(&[5; 71])),
        );
        assert!(matches!(err, Err(StoreError::TooLarge { size: 71, budget: 70 })));
        // Unpinned, it is the least recently used again and goes first.
        s.unpin(&a);
        let (_, ev) = put(&mut s, &[6; 75]);
        assert_eq!(ev, vec![a, d]);
        assert!(s.used_bytes() <= 100);
        // Removing a pinned blob releases its pin.
        let (e, _) = put(&mut s, &[7; 50]);
        assert!(s.pin(&e));
        assert!(s.remove(&e));
        let (f, _) = put(&mut s, &[8; 50]);
        assert!(s.pin(&f));
    }
}
