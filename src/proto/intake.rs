//! Intake of contributions: announcements checked against the manifest and their
//! signer, fetched, and the payload's header checked against the signed claims
//! (issue "Hostile peers": one author, one contribution per fragment round; claims bounded).

use super::core::{misbehaved, Protocol, MAX_IN_FLIGHT};
use super::fetch::{Claim, InFlight, Kind};
use super::held::Held;
use super::io::{Offence, Output};
use super::lane::Lane;
use super::schedule::{Millis, Window};
use super::{ContributionAnnounce, Message, PeerId};
use crate::delta::{self, ContentHash, Decoded};
use bytes::Bytes;

/// Most announcers of one payload whose claims are checked against its header (the rest
/// are only recorded: see `on_announce`).
const MAX_CLAIMS: usize = 8;

/// Most (author, round) pairs remembered as equivocating, per fragment.
const MAX_EQUIVOCATORS: usize = 4096;

impl Protocol {
    pub(super) fn on_message(
        &mut self,
        from: PeerId,
        msg: Message,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let p = msg.fragment() as usize;
        if p >= self.lanes.len() {
            return misbehaved(out, from, Offence::UnknownFragment, format!("fragment {p}"));
        }
        match msg {
            Message::State(s) => {
                // Like a vote, a recipe counts only for a round that can exist by our
                // clock: a far-future one would hold a slot until the table is pruned past it.
                let possible = s.round <= self.schedule.current_round(p, now).saturating_add(1);
                if let Some(recipe) = s.recipe.filter(|_| possible) {
                    self.lanes[p].note_recipe(from, s.hash, s.round, recipe);
                }
                self.vote(from, p, s.round, s.hash, s.took, s.parent, now, out)
            }
            Message::Contribution(c) => {
                // The base state is a vote, but state announcements carry the same votes a
                // moment later; it only matters when it shows we are behind (a restarted
                // peer learns where the swarm is one announcement earlier). Skipping it
                // otherwise halves the vote bookkeeping, which is per peer per round.
                let lane = &self.lanes[p];
                if c.base_round > lane.state.round.max(lane.closed_round).saturating_add(1) {
                    self.vote(from, p, c.base_round, c.base, None, None, now, out);
                }
                self.on_announce(from, p, c, now, out);
            }
        }
    }

    /// Checks an announcement's claims against the manifest; `Err` names the offence.
    fn check_claims(
        &self,
        from: PeerId,
        p: usize,
        c: &ContributionAnnounce,
    ) -> Result<(), Misdeed> {
        if c.origin != from {
            let detail = format!("announced a delta as {:?}", c.origin);
            return Err((Offence::ForgedAuthor, detail));
        }
        // No delta of this fragment can be larger (a stall that reserves the byte budget
        // with a huge announced size is a lie the size alone proves).
        let most = crate::delta::largest_payload(self.lanes[p].spec.numel())
            .min(self.limits.max_payload_bytes as u64);
        if c.size > most {
            let detail = format!("announced {} bytes, at most {most} for fragment {p}", c.size);
            return Err((Offence::Oversized, detail));
        }
        let most = c.steps.saturating_mul(self.settings.tokens_per_step());
        if c.steps == 0 || c.tokens > most {
            let detail = format!("{} tokens in {} steps", c.tokens, c.steps);
            return Err((Offence::InflatedClaim, detail));
        }
        Ok(())
    }

    fn on_announce(
        &mut self,
        from: PeerId,
        p: usize,
        c: ContributionAnnounce,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        if let Err((offence, detail)) = self.check_claims(from, p, &c) {
            self.metrics.rejected += 1;
            return misbehaved(out, from, offence, detail);
        }
        let lane = &self.lanes[p];
        // A delta outside its author's slot is not fetched: one identity gets one delta per
        // period into a sampled swarm's rounds, as an honest peer does. (Not an offence: a
        // peer on another state may see other slots.)
        if !lane.state.sampling.in_slot(from, p, c.round) {
            self.metrics.off_slot += 1;
            self.metrics.refused(from);
            return;
        }
        // One contribution per author per fragment round: the first announced wins.
        if lane.claims.get(&(from, c.round)).is_some_and(|h| *h != c.hash) {
            self.metrics.rejected += 1;
            // Which of the two came first differs from peer to peer; dropping every delta
            // of the author for that round gives all peers that saw both the same set.
            self.lanes[p].drop_equivocator(from, c.round);
            let detail = format!("second delta for round {}", c.round);
            return misbehaved(out, from, Offence::Equivocation, detail);
        }
        if lane.equivocated(from, c.round) {
            return;
        }
        let claim = Claim { author: from, round: c.round, tokens: c.tokens, steps: c.steps };
        if let Some(f) = self.in_flight.get_mut(&c.hash) {
            // Someone else announced the same bytes as theirs: only one of the two can be
            // the author the header names; the fetch result tells which.
            if let Kind::Delta { claims } = &mut f.kind {
                if claims.len() < MAX_CLAIMS && !claims.contains(&claim) {
                    claims.push(claim);
                }
            }
            // Recorded even when the list is full: copiers that announced first must not
            // keep the real author's claim out (`accept_delta` looks here too). Copies by
            // authors without a current credit fill at most half the map, as below: free
            // identities copying one delta must not use up the room of the members' own.
            let lane = &mut self.lanes[p];
            let room = credited_share(lane.votes.counts(&from), self.settings.raw().max_held);
            if lane.claims.len() < room {
                lane.claims.insert((from, c.round), c.hash);
            }
            return;
        }
        let current = self.schedule.current_round(p, now);
        let fresh = !Window::of(&self.settings).stale(c.round, current)
            && c.round <= current.saturating_add(1);
        if !fresh || lane.held.contains_key(&c.hash) || lane.state.has_merged(&c.hash) {
            return;
        }
        if self.rejected.contains(&c.hash) || self.blocked(&c.hash, now) {
            return;
        }
        let r = self.settings.raw();
        // Deltas being fetched count as announced: the budget holds before the bytes come.
        let held_bytes: u64 =
            self.lanes.iter().map(|l| l.held_bytes).sum::<u64>() + self.in_flight_bytes;
        // Authors without a current credit (strangers, fresh identities) may fill half of
        // each budget; the rest is kept for authors whose recent work went their rounds'
        // way, so a flood of well-formed announcements from free identities cannot keep
        // the swarm's working members out of the round.
        let credited = lane.votes.counts(&from);
        if self.in_flight.len() >= credited_share(credited, MAX_IN_FLIGHT)
            || lane.held.len() >= credited_share(credited, r.max_held)
            || lane.claims.len() >= credited_share(credited, r.max_held)
            || held_bytes.saturating_add(c.size) > credited_share(credited, r.max_held_bytes)
        {
            self.metrics.refused_full += 1;
            return;
        }
        self.lanes[p].claims.insert((from, c.round), c.hash);
        let kind = Kind::Delta { claims: vec![claim] };
        self.start_fetch(c.hash, p, kind, vec![from], c.size, now, out);
    }

    pub(super) fn accept_delta(
        &mut self,
        from: PeerId,
        hash: ContentHash,
        bytes: Bytes,
        f: &InFlight,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let p = f.fragment;
        let w = Window::of(&self.settings);
        let d = match delta::decode(&bytes, &self.lanes[p].spec, &self.limits) {
            Ok(d) => d,
            Err(e) => return self.reject(from, hash, Offence::BadPayload, e.to_string(), out),
        };
        let Kind::Delta { claims } = &f.kind else { return };
        // The header names the author; only that author's own (signed) announcement
        // credits it. Announcers whose claims the header contradicts lied.
        let header = header_claim(&d);
        for c in claims.iter().filter(|c| **c != header) {
            self.metrics.rejected += 1;
            let detail = format!("announced {c:?}, the payload says {header:?}");
            misbehaved(out, c.author, Offence::ClaimMismatch, detail);
        }
        // The author's signed announcement of this hash for this round: in the fetch's
        // list, or recorded after the list was full (its claims are then the header's,
        // held to the manifest's bound like any announcement's).
        let signed = self.lanes[p].claims.get(&(header.author, header.round)) == Some(&hash);
        let most = header.steps.saturating_mul(self.settings.tokens_per_step());
        let by_author = claims.contains(&header) || (signed && header.tokens <= most);
        if !by_author {
            // Not announced by its author (yet): wait for that announcement.
            return;
        }
        let lane = &mut self.lanes[p];
        let current = self.schedule.current_round(p, now);
        if w.stale(d.meta.round, current)
            || lane.state.has_merged(&hash)
            || lane.equivocated(header.author, header.round)
        {
            return;
        }
        self.grace.t_sync.update(now.saturating_sub(f.announced_at) as f64);
        let held = Held {
            origin: header.author,
            round: header.round,
            tokens: header.tokens,
            steps: header.steps,
            bytes,
            merged_at: None,
        };
        // Votes are earned by merged work that agreed with its round (`Lane::merge`). A
        // peer whose state is rounds behind (a joiner, a restarted peer) cannot judge that:
        // it credits verified, non-zero work on arrival so that it can find the swarm's
        // state, which it then adopts only with half of its credited voters behind it.
        let behind = lane.state.round.saturating_add(w.lag + 2) < current;
        if behind && d.norm > 0.0 {
            lane.votes.credit(header.author, header.round);
        }
        if lane.insert(hash, held, w) {
            self.check_quorum(p, now, out);
        }
        // Its votes may show we are behind (a joiner hears the states before it has
        // credited anyone): catch up now, not at the next vote or timer.
        if self.behind(p) {
            self.reconcile(p, now, out);
        }
    }
}

/// The part of a budget `cap` an announcer may fill: all of it for an author with a current
/// vote credit, half for everyone else.
fn credited_share<T: std::ops::Div<Output = T> + From<u8>>(credited: bool, cap: T) -> T {
    if credited {
        cap
    } else {
        cap / T::from(2)
    }
}

/// What a decoded delta's header claims, in the form announcements are checked in.
fn header_claim(d: &Decoded) -> Claim {
    Claim {
        author: PeerId(d.meta.author),
        round: d.meta.round,
        tokens: d.meta.tokens,
        steps: d.meta.steps,
    }
}

/// An offence and what exactly was wrong.
type Misdeed = (Offence, String);

impl Lane {
    /// Whether `author` announced two different deltas for `round`.
    pub fn equivocated(&self, author: PeerId, round: u64) -> bool {
        self.equivocators.contains(&(author, round))
    }

    /// Refuses every delta of `author` for `round`, also those already held but not merged.
    pub fn drop_equivocator(&mut self, author: PeerId, round: u64) {
        if self.equivocators.len() < MAX_EQUIVOCATORS {
            self.equivocators.insert((author, round));
        }
        let mut freed = 0;
        self.held.retain(|_, h| {
            let keep = h.origin != author || h.round != round || h.merged_at.is_some();
            if !keep {
                freed += h.bytes.len() as u64;
            }
            keep
        });
        self.held_bytes -= freed;
    }
}
