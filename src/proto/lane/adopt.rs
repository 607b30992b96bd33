//! Adopting the swarm's state in place of this peer's own (DESIGN.md §3.2): what the
//! adopted lineage already merged is marked merged, what only this peer had merged is
//! re-queued, and the new state is announced where others count a vote of this peer's.

use super::super::io::{Metrics, Output};
use super::super::schedule::Window;
use super::super::state::FragmentState;
use super::super::{ContributionAnnounce, Message, PeerId, Settings};
use super::Lane;
use crate::delta::ContentHash;
use bytes::Bytes;
use std::sync::OnceLock;

impl Lane {
    /// Marks held deltas that `new` already merged as merged, and re-queues those this peer
    /// had merged but `new` had not; returns the re-queued ones in hash order.
    fn requeue(&mut self, new: &FragmentState) -> Vec<ContentHash> {
        let mut resurrected = Vec::new();
        for (h, held) in self.held.iter_mut() {
            if new.has_merged(h) {
                held.merged_at = Some(new.round);
            } else if held.merged_at.is_some() {
                held.merged_at = None;
                resurrected.push(*h);
            }
        }
        resurrected.sort_unstable();
        resurrected
    }

    /// Replaces the state by `new` (the majority's). Contributions the new lineage already
    /// merged are marked merged; those this peer had merged but the new lineage had not are
    /// re-queued and re-announced, so they are merged once in the new lineage, not lost.
    pub fn adopt(
        &mut self,
        me: PeerId,
        new: FragmentState,
        hash: ContentHash,
        bytes: Bytes,
        settings: &Settings,
        m: &mut Metrics,
    ) -> Vec<Output> {
        let previous_round = self.state.round;
        let new_round = new.round;
        let w = Window::of(settings);
        let resurrected = self.requeue(&new);
        m.adoptions += 1;
        m.resurrected += resurrected.len() as u64;
        // Only the origin re-announces: every peer of a minority re-announcing every
        // re-queued delta would flood the swarm, and the origin holds its own deltas.
        let mut out = Vec::new();
        for h in resurrected {
            if let Some(held) = self.held.get(&h).filter(|held| held.origin == me) {
                let msg = Message::Contribution(ContributionAnnounce {
                    fragment: self.spec.id as u32,
                    round: held.round,
                    hash: h,
                    size: held.bytes.len() as u64,
                    tokens: held.tokens,
                    steps: held.steps,
                    origin: held.origin,
                    base: hash,
                    base_round: new_round,
                });
                out.push(Output::Publish { msg, payload: held.bytes.clone() });
            }
        }
        let before = std::mem::replace(&mut self.state, new);
        self.prior_before = self.prior.replace((self.state_hash, before));
        self.overtaken = None;
        self.state_hash = hash;
        self.state_bytes = OnceLock::from(bytes);
        self.votes.set_mine(self.state.round, hash, self.state.took(), self.state.parent);
        self.closed_round = self.closed_round.max(new_round);
        let pending = self.open.as_ref().map(|o| self.pending_for(o.round, w));
        if let (Some(o), Some(pending)) = (self.open.as_mut(), pending) {
            // The adopted state already contains this round's merge: do not merge it again.
            o.closed |= o.round <= new_round;
            (o.eligible, o.vouched) = pending;
        }
        let report = Output::Adopted {
            fragment: self.spec.id,
            round: self.state.round,
            hash,
            previous_round,
        };
        // Announced where others count a vote of this peer's for this round or a later one:
        // their view of what it holds must follow its adoption, or two peers holding each
        // other's old vote as the leader swap states and stay apart once the rounds stop
        // (seen at the end of real runs). In a sampled swarm most adoptions are by peers
        // that merged the round silently (not its contributors): nobody counts a vote of
        // theirs for it, and announcing every adoption was most of a 16-peer swarm's state
        // announcements (bench/RESULTS.md).
        let announce = self.state.sampling.period <= 1 || self.announced_round >= new_round;
        out.extend(self.after_state_change(settings, report, announce));
        out
    }
}
