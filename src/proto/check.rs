//! Checking a fetched state whose merge lists deltas this peer never got (DESIGN.md §3.6).
//!
//! A state made on a parent this peer holds can be recomputed once it holds every delta
//! the state's log lists. A peer that lost a few announcements (or fetched a delta too
//! late for its own merge) misses some; until now it took such a state on a plurality,
//! and two credited voters could then impose any state that names an honest parent and
//! lists deltas nobody has. Instead the missing deltas are fetched by their full hashes
//! (the log keeps them) from the state's holders, who merged them, into a side table the
//! merge intake never takes from ([`super::lane::Lane::listed`]); then the state is
//! checked again. A state listing a delta nobody serves is not adopted unless most of
//! every counted voter holds it (not only of the round's voters so far: colluders vote
//! first), and the next best state leads
//! ([`super::reconcile::Votes::leader_where`]). A state whose parent this peer never held
//! but which is one merge away from a state it holds is checked too: the deltas of both
//! merges are fetched, and the parent rebuilt first ([`super::lane::Lane::evidence`]).
//!
//! Cheaper than it sounds: a 4-bit delta is about 0.6 bytes a parameter, a state 8, so a
//! dozen deltas cost what the state itself did; a check that would cost more than the
//! state (or more than [`MAX_LISTED_FETCHES`] fetches) is not made, and the state is
//! weighed on its votes alone.

use super::core::Protocol;
use super::fetch::{InFlight, Kind};
use super::held::Held;
use super::io::{Offence, Output};
use super::schedule::Millis;
use super::state::FragmentState;
use super::PeerId;
use crate::delta::{self, ContentHash};
use bytes::Bytes;
use rand::seq::SliceRandom;

/// Most deltas one state check fetches.
pub(super) const MAX_LISTED_FETCHES: usize = 256;

/// Most peers a check's fetches name: the state's holders have every delta it lists (they
/// merged it, or checked it themselves); other holders of the round's lineage have most.
const MAX_CHECK_SOURCES: usize = 32;

/// A fetched state being weighed for adoption.
#[derive(Debug, Clone)]
pub(crate) struct Offer {
    /// Who served the state.
    pub from: PeerId,
    pub hash: ContentHash,
    /// Its wire form.
    pub bytes: Bytes,
    /// The round it was voted for.
    pub round: u64,
}

/// A fetched state waiting for the deltas its log lists.
#[derive(Debug, Clone)]
pub(crate) struct Check {
    pub offer: Offer,
    /// Listed deltas not here yet.
    pub waiting: Vec<ContentHash>,
}

impl Protocol {
    /// Starts fetching the deltas `state` (fetched as `offer`) lists and this peer lacks, when it holds the state's parent (or a state the
    /// parent may have been merged on), has not tried this state already and the deltas
    /// are few; false when no check was started.
    pub(super) fn start_check(
        &mut self,
        offer: &Offer,
        state: &FragmentState,
        p: usize,
        now: Millis,
        out: &mut Vec<Output>,
    ) -> bool {
        let Offer { from, hash, ref bytes, round } = *offer;
        let lane = &self.lanes[p];
        if lane.check.is_some() || lane.checked == Some(hash) {
            return false;
        }
        let Some(ids) = lane.check_ids(state) else { return false };
        let mut missing: Vec<ContentHash> =
            ids.into_iter().filter(|h| lane.listed_delta(h).is_none()).collect();
        missing.sort_unstable();
        missing.dedup();
        // Not a delta refused as malformed, nor one given up on (its announcers did not
        // serve it): asking the state's holders for it again let an unserved log through
        // (bench/RESULTS.md, "Strict states").
        let fetchable = |h: &ContentHash| !self.rejected.contains(h) && !self.blocked(h, now);
        // Worth it while the deltas cost less than the state did (gauged by the deltas held
        // here), and while they are few enough to ask for at once.
        let typical = lane.held_bytes.checked_div(lane.held.len() as u64).unwrap_or(0).max(1);
        let cost = typical.saturating_mul(missing.len() as u64);
        if missing.is_empty()
            || missing.len() > MAX_LISTED_FETCHES
            || cost > bytes.len() as u64
            || !missing.iter().all(fetchable)
        {
            return false;
        }
        // Its holders merged those deltas and offer them; so do, mostly, the holders of the
        // round's other states made on the same parent (their sets differ by a few late
        // deltas). A random few of them, and the peer that served the state last: it is
        // busy serving the state, and a state one peer holds would otherwise have every
        // checking peer of the swarm at its door.
        let mut sources = lane.votes.holders(round, hash);
        sources.retain(|&h| h != self.me && h != from);
        sources.shuffle(&mut self.rng);
        let mut kin = lane.votes.kin(round, state.parent);
        kin.retain(|h| *h != self.me && *h != from && !sources.contains(h));
        kin.shuffle(&mut self.rng);
        sources.extend(kin);
        sources.truncate(MAX_CHECK_SOURCES - 1);
        sources.push(from);
        let most =
            delta::largest_payload(lane.spec.numel()).min(self.limits.max_payload_bytes as u64);
        let lane = &mut self.lanes[p];
        lane.checked = Some(hash);
        lane.state_fetch = Some(hash);
        let waiting = missing.clone();
        lane.check = Some(Check { offer: offer.clone(), waiting });
        for h in missing {
            // One already on its way (as a contribution) is waited for, not fetched twice.
            if !self.in_flight.contains_key(&h) {
                self.start_fetch(h, p, Kind::Listed, sources.clone(), most, now, out);
            }
        }
        self.metrics.state_checks += 1;
        true
    }

    /// A delta a check waited for arrived as `bytes` (its hash already checked): kept in
    /// the side table, and the state is checked again once none is missing.
    pub(super) fn accept_listed(
        &mut self,
        from: PeerId,
        hash: ContentHash,
        bytes: Bytes,
        f: &InFlight,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let p = f.fragment;
        let lane = &mut self.lanes[p];
        let d = match delta::decode(&bytes, &lane.spec, &self.limits) {
            Ok(d) => d,
            Err(e) => {
                // Its hash is the one the state lists: the state merged a payload no honest
                // merge takes. Its server is reported; the state is not adopted.
                self.reject(from, hash, Offence::BadPayload, e.to_string(), out);
                return self.listed_failed(p, hash, now, out);
            }
        };
        let held = Held {
            origin: PeerId(d.meta.author),
            round: d.meta.round,
            tokens: d.meta.tokens,
            steps: d.meta.steps,
            bytes,
            merged_at: None,
        };
        if lane.check.as_ref().is_some_and(|c| c.waiting.contains(&hash)) {
            lane.listed.insert(hash, held);
        }
        self.listed_arrived(p, hash, now, out);
    }

    /// Delta `hash` of fragment `p` is here (fetched for a check, or as a contribution):
    /// a check that waited for it goes on when it was the last.
    pub(super) fn listed_arrived(
        &mut self,
        p: usize,
        hash: ContentHash,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let lane = &mut self.lanes[p];
        let Some(check) = lane.check.as_mut() else { return };
        check.waiting.retain(|h| *h != hash);
        if !check.waiting.is_empty() {
            return;
        }
        let Some(Check { offer, .. }) = lane.check.take() else { return };
        let hash = offer.hash;
        self.accept_offer(offer, p, now, out);
        let lane = &mut self.lanes[p];
        let listed = std::mem::take(&mut lane.listed);
        if lane.state_hash == hash {
            // Adopted: the deltas are this peer's now, as if it had merged them, and it
            // offers them to the next peer that checks the same state.
            for (h, mut d) in listed {
                d.merged_at = Some(lane.state.round);
                lane.held_bytes += d.bytes.len() as u64;
                if let Some(old) = lane.held.insert(h, d) {
                    lane.held_bytes -= old.bytes.len() as u64;
                }
            }
        }
    }

    /// A delta a check waited for could not be had from any holder: the state it was
    /// listed in cannot be recomputed. It is weighed on its votes again: adopted if most of
    /// every counted voter holds it, refused otherwise (and the next best state leads).
    pub(super) fn listed_failed(
        &mut self,
        p: usize,
        hash: ContentHash,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let lane = &mut self.lanes[p];
        if !lane.check.as_ref().is_some_and(|c| c.waiting.contains(&hash)) {
            return;
        }
        let Some(Check { offer, .. }) = lane.check.take() else { return };
        lane.listed.clear();
        self.accept_offer(offer, p, now, out);
        self.reconcile(p, now, out);
    }
}
