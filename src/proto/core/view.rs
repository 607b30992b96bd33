//! What a protocol instance shows the node, the simulator and tests: its id, settings,
//! states, agreement, grace window, metrics and backlog (read-only).

use super::super::io::Metrics;
use super::super::schedule::{Millis, Schedule};
use super::super::state::FragmentState;
use super::super::{PeerId, Settings};
use super::Protocol;
use crate::delta::ContentHash;

impl Protocol {
    pub fn me(&self) -> PeerId {
        self.me
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The replicated state of fragment `p` (what a checkpoint saves).
    pub fn state(&self, p: usize) -> &FragmentState {
        &self.lanes[p].state
    }

    /// The error-feedback residual of fragment `p`: what its published deltas have not
    /// sent yet (part of the peer's state, saved beside the anchors).
    pub fn residual(&self, p: usize) -> &[f32] {
        self.lanes[p].feedback.residual()
    }

    /// blake3 of the state of fragment `p`; equal on all peers when they agree.
    pub fn state_hash(&self, p: usize) -> ContentHash {
        self.lanes[p].state_hash
    }

    /// The encoded state of fragment `p` (what hashes to [`Protocol::state_hash`]).
    pub fn state_payload(&self, p: usize) -> &bytes::Bytes {
        self.lanes[p].state_bytes()
    }

    /// The contributions the merge that made fragment `p`'s state took (none for a state
    /// whose log does not end with its own round).
    pub fn last_merge(&self, p: usize) -> Vec<ContentHash> {
        let state = &self.lanes[p].state;
        match state.log.back() {
            Some((r, ids)) if *r == state.round => ids.clone(),
            _ => Vec::new(),
        }
    }

    /// The payload of delta `hash` of fragment `p`, if this peer holds it.
    pub fn held_payload(&self, p: usize, hash: &ContentHash) -> Option<bytes::Bytes> {
        self.lanes.get(p)?.held.get(hash).map(|h| h.bytes.clone())
    }

    /// Fraction of peers that announced our current round of `p` and hold our state.
    pub fn agreement(&self, p: usize) -> f64 {
        let lane = &self.lanes[p];
        lane.votes.agreement(lane.state.round, lane.state_hash)
    }

    /// The grace window now in force, in ms.
    pub fn grace_window(&self) -> Millis {
        self.grace.window()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Contributions held but not yet merged, over all fragments.
    pub fn pending(&self) -> usize {
        self.lanes.iter().map(|l| l.held.values().filter(|h| h.merged_at.is_none()).count()).sum()
    }
}
