//! Consensus on the status page: whether the run peers hold the states this peer held.
//!
//! A peer's heartbeat names each fragment's round and the short hash of its state then
//! (`heartbeat::ANCHOR_HEX` hex digits). Rounds move on between a heartbeat and the page,
//! so the comparison is made at the round the peer reported: this peer remembers the
//! short hash of its own state at each of its last [`ROUNDS_KEPT`] rounds per fragment.
//! A heartbeat is a stranger's claim; it is only displayed.

use std::collections::VecDeque;

use serde::Serialize;

use crate::heartbeat::table::PeerEntry;
use crate::heartbeat::{ANCHOR_HEX, MAX_ROUNDS};

/// Rounds of own state remembered per fragment.
pub const ROUNDS_KEPT: usize = 64;

/// This peer's recent states: per fragment, `(round, short hash)`, oldest first.
#[derive(Debug, Default)]
pub struct OwnAnchors {
    fragments: Vec<VecDeque<(u64, String)>>,
}

impl OwnAnchors {
    /// Remembers each fragment's current round and state hash (full or short).
    pub fn record(&mut self, rounds: &[u64], hashes: &[String]) {
        let n = rounds.len().min(hashes.len()).min(MAX_ROUNDS);
        self.fragments.resize_with(n, VecDeque::new);
        for (i, kept) in self.fragments.iter_mut().enumerate() {
            let short = hashes[i].get(..ANCHOR_HEX).unwrap_or(&hashes[i]).to_owned();
            if kept.back().is_some_and(|(r, h)| *r == rounds[i] && *h == short) {
                continue;
            }
            // A state replaced within its round (an adoption) is what the round ended on.
            if kept.back().is_some_and(|(r, _)| *r == rounds[i]) {
                kept.pop_back();
            }
            if kept.len() == ROUNDS_KEPT {
                kept.pop_front();
            }
            kept.push_back((rounds[i], short));
        }
    }

    /// Our short hash of fragment `i` at `round`, if remembered.
    fn at(&self, i: usize, round: u64) -> Option<&str> {
        let kept = self.fragments.get(i)?;
        kept.iter().rev().find(|(r, _)| *r == round).map(|(_, h)| h.as_str())
    }
}

/// One run peer's reported states, compared with ours.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeerAgreement {
    pub peer: String,
    /// Round of each fragment's state, as its heartbeat said.
    pub rounds: Vec<u64>,
    /// Per fragment: the same state as ours at that round (`true`), another (`false`), or
    /// a round we do not remember / no hash sent (`null`).
    pub agree: Vec<Option<bool>>,
}

/// The training peers among `peers` that sent their anchors, compared with `own`.
pub fn compare(own: &OwnAnchors, peers: &[PeerEntry]) -> Vec<PeerAgreement> {
    peers
        .iter()
        .filter(|p| p.heartbeat.trains && !p.heartbeat.anchors.is_empty())
        .map(|p| {
            let hb = &p.heartbeat;
            let agree = hb
                .rounds
                .iter()
                .zip(&hb.anchors)
                .enumerate()
                .map(|(i, (round, theirs))| own.at(i, *round).map(|ours| ours == theirs))
                .collect();
            PeerAgreement { peer: p.peer.clone(), rounds: hb.rounds.clone(), agree }
        })
        .collect()
}

/// A training peer's table entry with these rounds and anchors (tests of the page).
#[cfg(test)]
pub(crate) fn test_entry(peer: &str, rounds: &[u64], anchors: &[&str]) -> PeerEntry {
    PeerEntry {
        peer: peer.into(),
        received_unix_ms: 0,
        first_heard_unix_ms: 0,
        clock_offset_ms: 0,
        heartbeat: crate::heartbeat::Heartbeat {
            version: "0.1.0".into(),
            trains: true,
            manifest: None,
            step: 1,
            tokens_per_s: 1.0,
            val_bpb: None,
            rounds: rounds.to_vec(),
            anchors: anchors.iter().map(|a| a.to_string()).collect(),
            merges: 1,
            reachability: atoll_net::Reachability::Unknown,
            run_peers: 1,
            sent_unix_ms: 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_compared_at_the_round_they_reported() {
        let mut own = OwnAnchors::default();
        let full = |c: char| c.to_string().repeat(64);
        own.record(&[5, 5], &[full('a'), full('b')]);
        own.record(&[6, 5], &[full('c'), full('b')]);
        let peers = [
            test_entry("same", &[5, 5], &["aaaaaaaaaaaa", "bbbbbbbbbbbb"]),
            test_entry("other", &[6, 7], &["dddddddddddd", "bbbbbbbbbbbb"]),
            test_entry("v1", &[6, 5], &[]),
        ];
        let got = compare(&own, &peers);
        assert_eq!(got.len(), 2, "a peer without anchors is not listed");
        assert_eq!(got[0].agree, vec![Some(true), Some(true)]);
        assert_eq!(got[1].agree, vec![Some(false), None], "round 7 was never ours");
    }

    #[test]
    fn own_memory_is_bounded_and_keeps_what_a_round_ended_on() {
        let mut own = OwnAnchors::default();
        for round in 0..1_000u64 {
            own.record(&[round], &[format!("{round:012x}")]);
        }
        assert_eq!(own.fragments[0].len(), ROUNDS_KEPT);
        assert_eq!(own.at(0, 999), Some("0000000003e7"));
        assert_eq!(own.at(0, 10), None);
        // Adopted within round 999: the round ends on the adopted state.
        own.record(&[999], &["ffffffffffff".into()]);
        assert_eq!(own.at(0, 999), Some("ffffffffffff"));
        assert_eq!(own.fragments[0].len(), ROUNDS_KEPT);
    }
}
