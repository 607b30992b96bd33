//! What a peer offers to others that fetch from it, keyed by hash: its current state of
//! each fragment, its own latest deltas, and the deltas of each fragment's latest merge
//! (a peer checking a state that lists deltas it never got fetches them from the state's
//! holders, src/proto/check.rs). The [`Peer`](super::Peer) decides what is in
//! it; the simulator and the fuzz target serve from it directly, and the node mirrors it
//! into atoll-net's payload store through the [`Effect::Offer`] and [`Effect::Withdraw`]
//! each change returns.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

use super::Effect;
use crate::delta::ContentHash;

/// Payloads this peer offers (see the module docs).
#[derive(Debug, Default)]
pub struct Offered {
    payloads: HashMap<ContentHash, Bytes>,
    /// The current state of each fragment.
    states: Vec<Option<ContentHash>>,
    /// Own deltas, oldest first; at most `keep_own`.
    own: VecDeque<ContentHash>,
    /// The deltas each fragment's latest merge took.
    merged: Vec<Vec<ContentHash>>,
    keep_own: usize,
}

impl Offered {
    /// A store for `fragments` states that keeps the last `keep_own` own deltas.
    pub fn new(fragments: usize, keep_own: usize) -> Self {
        let merged = vec![Vec::new(); fragments];
        Self { states: vec![None; fragments], merged, keep_own, ..Self::default() }
    }

    pub fn get(&self, hash: &ContentHash) -> Option<Bytes> {
        self.payloads.get(hash).cloned()
    }

    /// Fragment `p`'s state is now `hash`: the previous one is no longer offered.
    pub fn set_state(&mut self, p: usize, hash: ContentHash, bytes: &Bytes) -> Vec<Effect> {
        let Some(slot) = self.states.get_mut(p) else { return Vec::new() };
        if *slot == Some(hash) {
            return Vec::new();
        }
        let old = slot.replace(hash);
        let mut changes = Vec::new();
        if let std::collections::hash_map::Entry::Vacant(e) = self.payloads.entry(hash) {
            e.insert(bytes.clone());
            changes.push(Effect::Offer { hash, payload: bytes.clone(), pinned: false });
        }
        if let Some(old) = old {
            changes.extend(self.forget(old));
        }
        changes
    }

    /// A new delta of this peer's own, pinned (an author that says "not here" for a delta
    /// it announced is struck); the oldest beyond `keep_own` is let go.
    pub fn add_own(&mut self, hash: ContentHash, bytes: &Bytes) -> Vec<Effect> {
        if self.own.contains(&hash) {
            return Vec::new(); // re-announced
        }
        self.payloads.insert(hash, bytes.clone());
        self.own.push_back(hash);
        let mut changes = vec![Effect::Offer { hash, payload: bytes.clone(), pinned: true }];
        while self.own.len() > self.keep_own {
            if let Some(old) = self.own.pop_front() {
                changes.extend(self.forget(old));
            }
        }
        changes
    }

    /// Fragment `p` merged `deltas` (with their payloads): offered, unpinned, until its
    /// next merge replaces them.
    pub fn set_merged(&mut self, p: usize, deltas: Vec<(ContentHash, Bytes)>) -> Vec<Effect> {
        let Some(slot) = self.merged.get_mut(p) else { return Vec::new() };
        let old = std::mem::replace(slot, deltas.iter().map(|(h, _)| *h).collect());
        let mut changes = Vec::new();
        for (hash, bytes) in deltas {
            if let std::collections::hash_map::Entry::Vacant(e) = self.payloads.entry(hash) {
                e.insert(bytes.clone());
                changes.push(Effect::Offer { hash, payload: bytes, pinned: false });
            }
        }
        changes.extend(old.into_iter().filter_map(|h| self.forget(h)));
        changes
    }

    /// Drops `hash` unless a state, an own delta or a latest merge still names it (a delta
    /// and a state never share a hash, but two fragments' states may).
    fn forget(&mut self, hash: ContentHash) -> Option<Effect> {
        let named = self.states.contains(&Some(hash))
            || self.own.contains(&hash)
            || self.merged.iter().any(|m| m.contains(&hash));
        (!named && self.payloads.remove(&hash).is_some()).then_some(Effect::Withdraw { hash })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u8) -> ContentHash {
        ContentHash([i; 32])
    }

    /// The effects as (hash, pinned) for offers and (hash, None) for withdrawals.
    fn said(effects: Vec<Effect>) -> Vec<(ContentHash, Option<bool>)> {
        effects
            .into_iter()
            .map(|e| match e {
                Effect::Offer { hash, pinned, .. } => (hash, Some(pinned)),
                Effect::Withdraw { hash } => (hash, None),
                other => panic!("not a store effect: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_new_state_replaces_the_old_one() {
        let mut s = Offered::new(2, 2);
        let b = Bytes::from_static(b"x");
        assert_eq!(said(s.set_state(0, h(1), &b)), vec![(h(1), Some(false))]);
        assert_eq!(said(s.set_state(0, h(1), &b)), vec![], "unchanged");
        let changes = said(s.set_state(0, h(2), &b));
        assert_eq!(changes, vec![(h(2), Some(false)), (h(1), None)]);
        assert!(s.get(&h(1)).is_none() && s.get(&h(2)).is_some());
        // Both fragments at the same state: replacing one keeps it for the other.
        s.set_state(1, h(2), &b);
        assert_eq!(said(s.set_state(0, h(3), &b)), vec![(h(3), Some(false))]);
        assert!(s.get(&h(2)).is_some());
        // Nothing else is kept: h(2) for fragment 1 and h(3) for fragment 0.
        assert_eq!(s.payloads.len(), 2);
    }

    #[test]
    fn a_merge_s_deltas_are_offered_until_the_next_merge() {
        let mut s = Offered::new(2, 2);
        let b = Bytes::from_static(b"m");
        let first = said(s.set_merged(0, vec![(h(1), b.clone()), (h(2), b.clone())]));
        assert_eq!(first, vec![(h(1), Some(false)), (h(2), Some(false))]);
        // An own delta that the merge took stays when the merge is replaced.
        s.add_own(h(2), &b);
        let next = said(s.set_merged(0, vec![(h(3), b.clone())]));
        assert_eq!(next, vec![(h(3), Some(false)), (h(1), None)]);
        assert!(s.get(&h(2)).is_some() && s.get(&h(3)).is_some());
        assert_eq!(said(s.set_merged(9, vec![(h(4), b)])), vec![], "no such fragment");
    }

    #[test]
    fn own_deltas_stay_pinned_until_the_window_moves_past_them() {
        let mut s = Offered::new(1, 2);
        let b = Bytes::from_static(b"d");
        assert_eq!(said(s.add_own(h(1), &b)), vec![(h(1), Some(true))]);
        assert_eq!(said(s.add_own(h(1), &b)), vec![], "a re-announcement changes nothing");
        s.add_own(h(2), &b);
        assert_eq!(said(s.add_own(h(3), &b)), vec![(h(3), Some(true)), (h(1), None)]);
        assert!(s.get(&h(1)).is_none());
        assert_eq!(s.get(&h(3)).as_deref(), Some(&b"d"[..]));
        assert_eq!(s.payloads.len(), 2, "h(2) and h(3)");
        // Out-of-range fragments are ignored, not a panic.
        assert_eq!(said(s.set_state(7, h(9), &b)), vec![]);
    }
}
