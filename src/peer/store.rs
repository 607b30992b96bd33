//! What a peer offers to others that fetch from it, keyed by hash: its current state of
//! each fragment and its own latest deltas. The [`Peer`](super::Peer) decides what is in
//! it; the simulator and the fuzz target serve from it directly, and the node mirrors it
//! into atoll-net's payload store through [`Effect::Offer`](super::Effect::Offer) and
//! [`Effect::Withdraw`](super::Effect::Withdraw).

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

use crate::delta::ContentHash;

/// Payloads this peer offers (see the module docs).
#[derive(Debug, Default)]
pub struct Offered {
    payloads: HashMap<ContentHash, Bytes>,
    /// The current state of each fragment.
    states: Vec<Option<ContentHash>>,
    /// Own deltas, oldest first; at most `keep_own`.
    own: VecDeque<ContentHash>,
    keep_own: usize,
}

/// What changed in the store: an executor with a store of its own follows it.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// Newly offered; `pinned`: an own delta that others may still fetch, which must not
    /// be evicted (an author that says "not here" for a delta it announced is struck).
    Added { hash: ContentHash, pinned: bool },
    /// No longer offered.
    Removed { hash: ContentHash },
}

impl Offered {
    /// A store for `fragments` states that keeps the last `keep_own` own deltas.
    pub fn new(fragments: usize, keep_own: usize) -> Self {
        Self { states: vec![None; fragments], keep_own, ..Self::default() }
    }

    pub fn get(&self, hash: &ContentHash) -> Option<Bytes> {
        self.payloads.get(hash).cloned()
    }

    pub fn len(&self) -> usize {
        self.payloads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.payloads.is_empty()
    }

    /// Fragment `p`'s state is now `hash`: the previous one is no longer offered.
    pub fn set_state(&mut self, p: usize, hash: ContentHash, bytes: &Bytes) -> Vec<Change> {
        let Some(slot) = self.states.get_mut(p) else { return Vec::new() };
        if *slot == Some(hash) {
            return Vec::new();
        }
        let old = slot.replace(hash);
        let mut changes = Vec::new();
        if let std::collections::hash_map::Entry::Vacant(e) = self.payloads.entry(hash) {
            e.insert(bytes.clone());
            changes.push(Change::Added { hash, pinned: false });
        }
        if let Some(old) = old {
            changes.extend(self.forget(old));
        }
        changes
    }

    /// A new delta of this peer's own; the oldest beyond `keep_own` is let go.
    pub fn add_own(&mut self, hash: ContentHash, bytes: &Bytes) -> Vec<Change> {
        if self.own.contains(&hash) {
            return Vec::new(); // re-announced
        }
        self.payloads.insert(hash, bytes.clone());
        self.own.push_back(hash);
        let mut changes = vec![Change::Added { hash, pinned: true }];
        while self.own.len() > self.keep_own {
            if let Some(old) = self.own.pop_front() {
                changes.extend(self.forget(old));
            }
        }
        changes
    }

    /// Drops `hash` unless a state or an own delta still names it (a delta and a state
    /// never share a hash, but two fragments' states may).
    fn forget(&mut self, hash: ContentHash) -> Option<Change> {
        let named = self.states.contains(&Some(hash)) || self.own.contains(&hash);
        (!named && self.payloads.remove(&hash).is_some()).then_some(Change::Removed { hash })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u8) -> ContentHash {
        ContentHash([i; 32])
    }

    #[test]
    fn a_new_state_replaces_the_old_one() {
        let mut s = Offered::new(2, 2);
        let b = Bytes::from_static(b"x");
        assert_eq!(s.set_state(0, h(1), &b), vec![Change::Added { hash: h(1), pinned: false }]);
        assert_eq!(s.set_state(0, h(1), &b), vec![], "unchanged");
        let changes = s.set_state(0, h(2), &b);
        assert_eq!(
            changes,
            vec![Change::Added { hash: h(2), pinned: false }, Change::Removed { hash: h(1) }]
        );
        assert!(s.get(&h(1)).is_none() && s.get(&h(2)).is_some());
        // Both fragments at the same state: replacing one keeps it for the other.
        s.set_state(1, h(2), &b);
        assert_eq!(s.set_state(0, h(3), &b), vec![Change::Added { hash: h(3), pinned: false }]);
        assert!(s.get(&h(2)).is_some());
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn own_deltas_stay_pinned_until_the_window_moves_past_them() {
        let mut s = Offered::new(1, 2);
        let b = Bytes::from_static(b"d");
        assert_eq!(s.add_own(h(1), &b), vec![Change::Added { hash: h(1), pinned: true }]);
        assert_eq!(s.add_own(h(1), &b), vec![], "a re-announcement changes nothing");
        s.add_own(h(2), &b);
        assert_eq!(
            s.add_own(h(3), &b),
            vec![Change::Added { hash: h(3), pinned: true }, Change::Removed { hash: h(1) }]
        );
        assert!(s.get(&h(1)).is_none());
        assert_eq!(s.get(&h(3)).as_deref(), Some(&b"d"[..]));
        assert!(!s.is_empty());
        // Out-of-range fragments are ignored, not a panic.
        assert_eq!(s.set_state(7, h(9), &b), vec![]);
    }
}
