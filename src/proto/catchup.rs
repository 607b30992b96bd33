//! Reconciliation and catch-up (DESIGN.md §3.2): votes, "am I behind?", fetching and
//! adopting the majority's state.

use super::check::Offer;
use super::core::{misbehaved, Protocol};
use super::evidence::Evidence;
use super::fasthash::FastSet;
use super::fetch::Kind;
use super::io::{Offence, Output};
use super::schedule::Millis;
use super::state::FragmentState;
use super::weigh::{POISON_MARGIN, WORSE_MARGIN};
use super::PeerId;
use crate::delta::ContentHash;
use bytes::Bytes;
use rand::Rng;

/// What becomes of a fetched state nothing here can recompute.
enum Verdict {
    /// Adopted.
    Take,
    /// Adopted if the trainer finds it no worse than this peer's own by more than this
    /// margin (`Protocol::ask_weigh`): [`WORSE_MARGIN`] for a state no majority holds,
    /// [`POISON_MARGIN`] for one most voters hold.
    Weigh(f64),
    /// Being checked, or refused.
    Leave,
}

impl Protocol {
    /// Records a peer's state (and, from a state announcement, how many contributions it
    /// claims the state took and the state it claims it was merged on), and starts catching up at once if the swarm is ahead.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn vote(
        &mut self,
        from: PeerId,
        p: usize,
        round: u64,
        hash: ContentHash,
        took: Option<u32>,
        parent: Option<ContentHash>,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        // Only rounds that can exist by our clock count; a vote for a far future round
        // would otherwise make us chase a state nobody can have merged.
        if round > self.schedule.current_round(p, now).saturating_add(1) {
            return;
        }
        let votes = &mut self.lanes[p].votes;
        votes.record(from, round, hash);
        votes.claim(from, round, hash, took, parent);
        if self.behind(p) {
            self.reconcile(p, now, out);
        }
    }

    /// More than one round behind the most advanced state heard of (restarted, partitioned
    /// or too slow): merging on our own state would only produce a lineage nobody shares.
    pub(super) fn behind(&self, p: usize) -> bool {
        let lane = &self.lanes[p];
        let done = lane.state.round.max(lane.closed_round);
        lane.state_fetch.is_none() && lane.votes.max_round() > done.saturating_add(1)
    }

    /// The newest round any peer announced a state for on fragment `p` (0: none heard).
    pub fn heard_round(&self, p: usize) -> u64 {
        self.lanes[p].votes.max_round()
    }

    /// Fragment `p` holds a state no more than one round older than the newest one heard of
    /// (that round's merge may be under way), and some state was heard at all: what a
    /// fresh peer joining a running swarm waits for before its first inner step.
    pub fn caught_up(&self, p: usize) -> bool {
        let lane = &self.lanes[p];
        let heard = lane.votes.max_round();
        heard > 0 && lane.state_fetch.is_none() && lane.state.round.saturating_add(1) >= heard
    }

    /// Reconciliation (DESIGN.md §3.2): if the state most recently heard peers hold for
    /// our round (or a later one, when we are behind) differs from ours, fetch it.
    pub(super) fn reconcile(&mut self, p: usize, now: Millis, out: &mut Vec<Output>) {
        self.drop_stale_weighing(p, now);
        let max_round = self.schedule.current_round(p, now);
        let lane = &self.lanes[p];
        if lane.state_fetch.is_some() {
            return;
        }
        // In a sampled swarm a peer announces a merge's state only if it contributed to it.
        // One whose merge took another set than the contributors' (a late delta) then holds
        // a state nobody hears of. If that state leads (no other state of the round was
        // heard, or it wins the tie), it is announced now, so the swarm reconciles with it:
        // at the end of a run, when no later round comes to reveal the split, the anchors
        // would otherwise stay apart. If another state leads, this peer follows it below
        // and announcing its own would only be one more message for every peer.
        let (round, hash) = (lane.state.round, lane.state_hash);
        let unheard = lane.state.sampling.period > 1
            && round > 0
            && !lane.votes.holders(round, hash).iter().any(|&h| h != self.me);
        self.lanes[p].forget_settled_grandparent();
        let lane = &mut self.lanes[p];
        // A peer whose vote lapsed follows the counted voters' latest state even where its
        // own lineage ran ahead of it: nobody follows that lineage.
        let following = !lane.votes.counts(&self.me);
        let lane = &self.lanes[p];
        let skip = |h: &ContentHash| self.blocked(h, now) || self.rejected.contains(h);
        let strict = self.settings.raw().strict_states;
        let leader = lane.votes.latest_round(max_round).and_then(|latest| {
            let target = if following { latest } else { latest.max(lane.state.round) };
            if strict {
                lane.votes.leader_where(target, skip)
            } else {
                lane.votes.leader(target).filter(|l| !skip(&l.hash))
            }
        });
        let Some(leader) = leader.filter(|l| l.hash != hash) else {
            if unheard {
                out.push(self.lanes[p].announcement());
            }
            return;
        };
        // A state made from a parent and deltas held here is recomputed, not fetched:
        // kilobytes of deltas at most instead of the whole fragment's anchor and momentum.
        if let Some((state, bytes)) =
            lane.recompute(leader.hash, leader.round, &self.settings, &self.limits)
        {
            if self.misclaimed(p, leader.round, leader.hash, &state, now, out) {
                return;
            }
            self.metrics.recomputed += 1;
            let lane = &mut self.lanes[p];
            let me = self.me;
            out.extend(lane.adopt(
                me,
                state,
                leader.hash,
                bytes,
                &self.settings,
                &mut self.metrics,
            ));
            return;
        }
        // A recipe that lacks only deltas still on their way (the late ones this peer's
        // merge missed) is tried again when they land: a fetched state would arrive no
        // sooner, at 8 bytes a parameter.
        if let Some(missing) = lane.recipe_missing(leader.hash, leader.round) {
            let flying: FastSet<u64> = self
                .in_flight
                .iter()
                .filter(|(_, f)| f.fragment == p && matches!(f.kind, Kind::Delta { .. }))
                .map(|(h, _)| h.short())
                .collect();
            if !missing.is_empty() && missing.iter().all(|id| flying.contains(id)) {
                self.lanes[p].recipe_wait = Some(leader.hash);
                return;
            }
        }
        // A recipe that did not give the state (false, or a delta not here) is not tried
        // again: the state is fetched.
        self.metrics.state_fetch_causes.count(self.lanes[p].why_fetched(leader.hash, leader.round));
        self.lanes[p].drop_recipes(leader.hash);
        let mut sources: Vec<PeerId> =
            leader.holders.into_iter().filter(|&h| h != self.me).collect();
        if sources.is_empty() {
            return;
        }
        // Start at a random holder so a thousand peers do not all ask the same one.
        let start = self.rng.random_range(0..sources.len());
        sources.rotate_left(start);
        sources.truncate(8);
        // The state's log grows with the swarm; the payload limit bounds it.
        let max_len = self.limits.max_payload_bytes as u64;
        self.lanes[p].state_fetch = Some(leader.hash);
        let kind = Kind::State { round: leader.round };
        self.start_fetch(leader.hash, p, kind, sources, max_len, now, out);
    }

    /// Checks what the holders of state `hash` of `round` claimed of it against `state`
    /// itself: the count its log bears and the parent it names. Those that claimed another
    /// announced a state they do not hold, or lied about it to win a tie or lend it a
    /// lineage: they lose their votes and are reported, and reconciliation picks again
    /// without them (true: the state is not to be adopted now).
    fn misclaimed(
        &mut self,
        p: usize,
        round: u64,
        hash: ContentHash,
        state: &FragmentState,
        now: Millis,
        out: &mut Vec<Output>,
    ) -> bool {
        let took = state.took();
        let votes = &self.lanes[p].votes;
        let counts = votes.misclaimed(round, hash, took);
        let parents = votes.misparented(round, hash, state.parent);
        if counts.is_empty() && parents.is_empty() {
            return false;
        }
        for (liars, what) in [(counts, format!("count ({took})")), (parents, "parent".into())] {
            for liar in liars {
                self.lanes[p].votes.discredit(liar);
                self.metrics.refused(liar);
                let detail = format!("claimed another {what} for state {hash:?} of round {round}");
                misbehaved(out, liar, Offence::ForgedState, detail);
            }
        }
        self.metrics.forged_states += 1;
        self.reconcile(p, now, out);
        true
    }

    pub(super) fn accept_state(
        &mut self,
        from: PeerId,
        hash: ContentHash,
        bytes: Bytes,
        p: usize,
        voted_round: u64,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        self.accept_offer(Offer { from, hash, bytes, round: voted_round }, p, now, out);
    }

    /// [`Self::accept_state`] of a state held as an [`Offer`] (one a check waited on).
    pub(super) fn accept_offer(
        &mut self,
        offer: Offer,
        p: usize,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let Offer { from, hash, ref bytes, round: voted_round } = offer;
        let lane = &mut self.lanes[p];
        lane.state_fetch = None;
        let state = match FragmentState::from_bytes(bytes, &lane.spec) {
            Ok(s) => s,
            Err(e) => return self.reject(from, hash, Offence::BadPayload, e.to_string(), out),
        };
        // The votes were for a state of `voted_round` (a round that can exist by our
        // clock); a payload of another round under that hash was forged by its voters.
        if state.round != voted_round {
            let detail = format!("state of round {} voted as round {voted_round}", state.round);
            return self.reject(from, hash, Offence::BadState, detail, out);
        }
        if self.misclaimed(p, voted_round, hash, &state, now, out) {
            return;
        }
        let lane = &mut self.lanes[p];
        if hash == lane.state_hash {
            return;
        }
        match lane.evidence(&state, hash, &self.settings, &self.limits) {
            Evidence::Verified => {}
            Evidence::Forged(detail) => {
                // Its voters vouched for a forgery: their votes stop counting here, and each
                // is named among the refused.
                let mut voters = lane.votes.holders(voted_round, hash);
                if !voters.contains(&from) {
                    voters.push(from);
                }
                for voter in voters.into_iter().filter(|&v| v != self.me) {
                    lane.votes.discredit(voter);
                    self.metrics.refused(voter);
                }
                self.metrics.forged_states += 1;
                return self.reject(from, hash, Offence::ForgedState, detail, out);
            }
            Evidence::Unverifiable => match self.weigh_unverifiable(&offer, &state, p, now, out) {
                Verdict::Take => {}
                Verdict::Weigh(margin) if self.weighs => {
                    return self.ask_weigh(offer, state, margin, p, now, out)
                }
                Verdict::Weigh(_) => {}
                Verdict::Leave => return,
            },
        }
        self.take(offer, state, p, out);
    }

    /// Adopts `state`, fetched as `offer` and found fit to adopt.
    pub(super) fn take(
        &mut self,
        offer: Offer,
        state: FragmentState,
        p: usize,
        out: &mut Vec<Output>,
    ) {
        let hash = offer.hash;
        let lane = &mut self.lanes[p];
        if hash == lane.state_hash {
            return;
        }
        // A state older than ours came too late to adopt (this peer merged a later round
        // on its own lineage meanwhile). The swarm's next state names it as its parent, so
        // it is kept, checked as an adoption would be, to recompute that one from its
        // recipe rather than chase the swarm a fetch behind for good.
        if state.round < lane.state.round && lane.votes.counts(&self.me) {
            if lane.overtaken.as_ref().is_none_or(|(_, s)| s.round < state.round) {
                lane.overtaken = Some((hash, state));
            }
            return;
        }
        // The fetched bytes are the state's wire form: their hash was checked on arrival.
        out.extend(lane.adopt(
            self.me,
            state,
            hash,
            offer.bytes,
            &self.settings,
            &mut self.metrics,
        ));
    }

    /// Whether `state` (fetched as `offer`), which nothing held here recomputes yet, is to
    /// be adopted now, or weighed first; when neither, its check was started or it was
    /// refused.
    fn weigh_unverifiable(
        &mut self,
        offer: &Offer,
        state: &FragmentState,
        p: usize,
        now: Millis,
        out: &mut Vec<Output>,
    ) -> Verdict {
        let Offer { from, hash, round, .. } = *offer;
        let lane = &self.lanes[p];
        let done = lane.state.round.max(lane.closed_round);
        let joining = done == 0 || lane.votes.max_round() > done.saturating_add(1);
        let strict = self.settings.raw().strict_states;
        // At least half of the counted voters holding it: a plurality is not enough, or two
        // credited voters would impose any state on a swarm whose honest votes are spread
        // one or two to a state (each peer's own merge, at merge lag 0).
        // With strict states, more than half of every counted voter, not of the round's
        // votes so far: colluders vote the moment they merge, so half of the votes in can be
        // theirs while an honest peer's vote is still on its way (6 of 13 credited voters
        // made a forged state "backed" so in the simulator).
        let backed = if strict {
            lane.votes.held_by_most(round, hash)
        } else {
            lane.votes.backed(round, hash)
        };
        // Or a lineage: most of the round's counted voters hold states merged on its
        // parent, which this peer never held (its own lineage went another way: a healed
        // partition, or a round it merged with another set). It follows the state that
        // leads among them, or a swarm split into many states would never join again. Not
        // for a peer without a lineage of its own (a joiner, a restarted or far-behind
        // peer), nor for one of that lineage (see `lineage_backs`), nor for a state that
        // lists deltas nobody announced (`plausible`). With strict states, only once the
        // lineage settled on it (`Lane::settled`): colluders voting a made-up state on the
        // lineage's parent lead it while its honest peers each hold their own merge.
        let lineage = !joining
            && lane.lineage_backs(round, state)
            && lane.plausible(state)
            && (!strict || lane.settled(round, hash, state.parent));
        // Or, with strict states, the swarm's lineages came apart and none holds most of the
        // round's voters: the largest one's settled state is followed (`Lane::leads_apart`),
        // so the swarm joins again instead of keeping a lineage per peer to the end of the
        // run. Not for a peer without a lineage of its own (as above).
        let apart = strict && !joining && lane.leads_apart(round, hash, state);
        let tried = lane.checked == Some(hash);
        // Most of the counted voters hold it. Still weighed, against a loose bound, by a
        // peer with a trained state to lose: a peer that counts few voters (a lossy
        // network, early in a run) can count more colluders than honest peers, and a
        // poisoned state is far worse than any honest one. Not by a fresh joiner, whose own
        // state is the run's initial one (nothing trained to lose; its join stays fast);
        // by a peer that fell behind, which has.
        let fresh = lane.state.round == 0;
        let majority = if fresh { Verdict::Take } else { Verdict::Weigh(POISON_MARGIN) };
        if strict && lane.holds(state.parent) {
            // Made on a parent held here, it lacks only deltas: they are fetched and the
            // state checked again (src/proto/check.rs). One that cannot be checked is not
            // taken on votes, which colluders cast the moment they merge; one whose check
            // failed is, if most of every counted voter holds it (a minority of colluders
            // never does, whatever share of the round's votes so far is theirs).
            if tried && lane.votes.held_by_most(round, hash) {
                return majority;
            }
        } else if backed || lineage {
            return majority;
        } else if apart || (!joining && !strict) {
            // No majority holds it: it leads a split swarm's lineages, or (without strict
            // states) the plurality's votes. A tie between lineages goes to the smaller
            // parent hash, which colluders can make up, and a plurality is what two of
            // them reach in a swarm whose honest votes are spread: weighed first.
            return Verdict::Weigh(WORSE_MARGIN);
        }
        // Otherwise checked first (a state one merge away from one held here is too), and
        // refused when it cannot be.
        if !self.start_check(offer, state, p, now, out) {
            self.refuse_unbacked(from, hash, now);
        }
        Verdict::Leave
    }

    /// Refuses state `hash`, served by `from`, that nothing here can recompute and not
    /// enough voters back: not chased again for a period, and the next best state leads.
    pub(super) fn refuse_unbacked(&mut self, from: PeerId, hash: ContentHash, now: Millis) {
        self.metrics.unbacked_states += 1;
        self.refuse_state(from, hash, now);
    }

    /// Leaves state `hash`, served by `from`, for a period: the next best state leads.
    pub(super) fn refuse_state(&mut self, from: PeerId, hash: ContentHash, now: Millis) {
        self.metrics.refused(from);
        let until = now.saturating_add(self.settings.period_ms());
        self.block(hash, until);
    }
}
