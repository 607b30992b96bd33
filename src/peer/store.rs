//! What a peer offers to others that fetch from it, keyed by hash: its current state of
//! each fragment and its own latest deltas. The [`Peer`](super::Peer) decides what is in
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
    keep_own: usize,
}

impl Offered {
    /// A store for `fragments` states that keeps the last `keep_own` own deltas.
    pub fn new(fragments: usize, keep_own: usize) -> Self {
        Self { states: vec![None; fragments], keep_own, ..Self::default() }
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

    /// Drops `hash` unless a state or an own delta still names it (a delta and a state
    /// never share a hash, but two fragments' states may).
    fn forget(&mut self, hash: ContentHash) -> Option<Effect> {
        let named = self.states.contains(&Some(hash)) || self.own.contains(&hash);
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
