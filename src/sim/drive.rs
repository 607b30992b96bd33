//! Carrying out the peers' effects inside the simulation.

use super::{gossip_len, Ev, Sim};
use crate::delta::ContentHash;
use crate::peer::{Effect, PeerEvent};
use crate::proto::{Event, Output, PeerId};

/// The share of a fragment's initial loss that a simulated validation keeps whatever the
/// parameters (see `Output::Weigh` in `Sim::output`).
const VAL_FLOOR: f64 = 0.2;

impl Sim {
    pub(super) fn start_peer(&mut self, i: usize) {
        let now = self.peer_now(i);
        if let Some(p) = self.slots[i].peer.as_mut() {
            let effects = p.start(now);
            self.carry_out(i, effects);
            self.schedule_trained(i);
        }
    }

    /// Peer `i`'s clock (ahead of the simulation by its skew).
    fn peer_now(&self, i: usize) -> u64 {
        self.now + self.slots[i].skew
    }

    pub(super) fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Proto { peer, inc, event } => {
                if self.slots[peer].inc == inc {
                    self.feed(peer, event);
                }
            }
            Ev::Snapshot { peer, inc, fragment, round } => {
                if self.slots[peer].inc == inc {
                    let event = self.snapshot(peer, fragment, round);
                    self.feed(peer, event);
                }
            }
            Ev::Poll { peer, inc } if self.slots[peer].inc == inc => self.poll(peer),
            Ev::Trained { peer, inc } if self.slots[peer].inc == inc => self.trained(peer),
            Ev::Poll { .. } | Ev::Trained { .. } => {}
        }
    }

    fn feed(&mut self, i: usize, event: Event) {
        let now = self.peer_now(i);
        let Some(p) = self.slots[i].peer.as_mut() else { return };
        let effects = p.handle(PeerEvent::Core(event), now);
        self.carry_out(i, effects);
    }

    /// The fetch contract of [`Output::Fetch`], as atoll-net keeps it: the holders in
    /// turn, each attempt until an answer or `fetch_timeout_ms` (a lost request or
    /// transfer is retried, from the next holder), payloads checked against their hash,
    /// until one delivers or the deadline passes; a holder that says it has nothing is not
    /// asked again. Exactly one answer, none after the deadline (the core gives up by
    /// itself). Payloads are immutable by hash, so each answer is computed now and only
    /// its timing is simulated.
    fn fetch(
        &mut self,
        requester: usize,
        inc: u32,
        hash: ContentHash,
        holders: &[PeerId],
        max_len: u64,
        deadline: u64,
    ) {
        let attempt = self.settings().raw().fetch_timeout_ms.max(1);
        let mut left: Vec<(PeerId, usize)> = holders
            .iter()
            .filter_map(|&h| Some((h, super::byzantine::server_of(h, self.slots.len())?)))
            .collect();
        let mut t = self.now;
        let mut next = 0;
        let mut denied = Vec::new();
        while !left.is_empty() && t < deadline {
            let (holder, server) = left[next % left.len()];
            next += 1;
            let Some(arrive) = self.net.small(&mut self.rng, requester, server, t) else {
                t = t.saturating_add(attempt);
                continue;
            };
            let up = self.slots[server].peer.as_ref();
            let bytes = up.and_then(|p| self.byz.serve(server, &hash).or_else(|| p.payload(&hash)));
            if up.is_some() && bytes.is_none() && !denied.contains(&holder) {
                // Up, and says it does not hold what it announced.
                denied.push(holder);
            }
            match bytes {
                Some(bytes) if bytes.len() as u64 <= max_len && ContentHash::of(&bytes) == hash => {
                    let len = bytes.len();
                    self.bytes[server].payload_sent += len as u64;
                    match self.net.bulk(&mut self.rng, server, requester, arrive, len) {
                        Some(at) if at <= deadline => {
                            self.bytes[requester].payload_received += len as u64;
                            let event = Event::Fetched { from: holder, hash, bytes };
                            self.queue.push(at, Ev::Proto { peer: requester, inc, event });
                            return;
                        }
                        _ => t = t.saturating_add(attempt),
                    }
                }
                _ => {
                    // Nothing (or junk) from this holder: the others are asked.
                    let refused = self.net.small(&mut self.rng, server, requester, arrive);
                    t = refused.unwrap_or(t.saturating_add(attempt));
                    next -= 1;
                    left.remove(next % left.len());
                }
            }
        }
        if left.is_empty() && t < deadline {
            let from = holders.first().copied().unwrap_or(PeerId(0));
            let event = Event::FetchFailed { from, hash, denied, silent: Vec::new() };
            self.queue.push(t, Ev::Proto { peer: requester, inc, event });
        }
    }

    /// Carries out the effects of peer `i`, then queues its next poll.
    pub(super) fn carry_out(&mut self, i: usize, effects: Vec<Effect>) {
        for e in effects {
            match e {
                Effect::Core(o) => self.output(i, o),
                // Served from the peer's own store when a fetch asks (`Peer::payload`).
                Effect::Offer { .. } | Effect::Withdraw { .. } => {}
                Effect::Release(r) => self.release(i, r),
                Effect::Finish { anchors } => self.finish(i, anchors),
            }
        }
        self.schedule_poll(i);
    }

    fn snapshot(&mut self, i: usize, fragment: usize, round: u64) -> Event {
        let slot = &mut self.slots[i];
        if !slot.held {
            slot.trainer.advance(self.now, &self.problem);
        }
        let start = self.offsets[fragment];
        let params =
            slot.trainer.theta[start..start + self.plan.fragments[fragment].numel()].to_vec();
        let steps = slot.trainer.steps - slot.snap_steps[fragment];
        slot.snap_steps[fragment] = slot.trainer.steps;
        Event::Snapshot { fragment, round, params, tokens: steps * self.cfg.batch_tokens, steps }
    }

    fn output(&mut self, i: usize, o: Output) {
        let inc = self.slots[i].inc;
        match o {
            Output::Publish { msg, .. } if self.byz.is_hostile(i) => self.hostile_broadcast(i, msg),
            Output::Publish { msg, .. } => self.broadcast(i, msg),
            Output::Fetch { hash, holders, max_len, deadline } => {
                let deadline = deadline.saturating_sub(self.slots[i].skew);
                self.fetch(i, inc, hash, &holders, max_len, deadline)
            }
            // Every fetch is answered or dropped by the deadline; nothing to stop.
            Output::CancelFetch { .. } => {}
            Output::SetTimer { at, timer } => {
                let at = at.saturating_sub(self.slots[i].skew).max(self.now);
                self.queue.push(at, Ev::Proto { peer: i, inc, event: Event::Timer(timer) });
            }
            Output::Snapshot { fragment, round } => {
                let at = self.slots[i].trainer.step_end(self.now);
                self.queue.push(at, Ev::Snapshot { peer: i, inc, fragment, round });
            }
            Output::Weigh { fragment, hash, anchor, own, margin, .. } => {
                // Answered between two steps, on the problem's global loss (the validation
                // set every peer shares), plus the part no training removes: a language
                // model's validation loss keeps the text's entropy, about a fifth of its
                // initial loss (ln 256 ≈ 5.5 nats a byte at first, ~1 nat for a good
                // model), which the quadratic lacks.
                let start = self.offsets[fragment];
                let init = &self.init[start..start + anchor.len().min(own.len())];
                let floor = VAL_FLOOR * self.problem.loss_at(start, init);
                let offered = floor + self.problem.loss_at(start, &anchor);
                let own = floor + self.problem.loss_at(start, &own);
                let losses = crate::proto::Losses { offered, own };
                if !self.byz.is_hostile(i) {
                    self.stats.weighed += 1;
                    self.stats.weighed_worse += u64::from(!losses.passes(margin));
                }
                let losses = self.cfg.weigh_states.then_some(losses);
                let event = Event::Weighed { fragment, hash, losses };
                let at = self.slots[i].trainer.step_end(self.now);
                self.queue.push(at, Ev::Proto { peer: i, inc, event });
            }
            Output::Apply(a) => {
                let slot = &mut self.slots[i];
                if !slot.held {
                    slot.trainer.advance(self.now, &self.problem);
                }
                let start = self.offsets[a.fragment];
                slot.trainer.apply(start..start + a.anchor.len(), &a.anchor, a.alpha);
            }
            Output::Merged(r) => {
                self.stats.merges += 1;
                self.stats.max_waited_ms = self.stats.max_waited_ms.max(r.waited_ms);
                self.stats.grace_sum_ms += r.grace_ms;
                self.stats.merged_contributions += r.merged.len() as u64;
                self.stats.late_merged += r.late as u64;
                if !self.byz.is_hostile(i) {
                    self.weigh(&r.contributions);
                }
                if let Some(l) = self.lineages.as_mut() {
                    l.merged(i, &r, &mut self.stats);
                }
            }
            Output::Skipped { .. } => self.stats.skipped += 1,
            Output::Banked { .. } => {}
            Output::Adopted { fragment, hash, .. } => {
                self.stats.adoptions += 1;
                if let Some(l) = self.lineages.as_mut() {
                    l.adopted(i, fragment, hash, &mut self.stats);
                }
            }
            Output::Misbehaved { offence, .. } => {
                self.stats.misbehaved += 1;
                if !self.byz.is_hostile(i) {
                    *self.stats.offences.entry(offence).or_default() += 1;
                }
            }
        }
    }

    /// Adds an honest merge's contributions to the influence tally (`Stats::hostile_share`).
    fn weigh(&mut self, contributions: &[crate::proto::Contribution]) {
        let peers = self.slots.len();
        for c in contributions {
            let w = c.tokens as f64 * c.agreement;
            self.stats.merged_weight += w;
            let server = super::byzantine::server_of(c.origin, peers);
            if server.is_some_and(|s| self.byz.is_hostile(s)) {
                self.stats.hostile_weight += w;
            }
        }
    }

    fn broadcast(&mut self, i: usize, msg: crate::proto::Message) {
        if matches!(msg, crate::proto::Message::State(_)) {
            self.stats.state_announcements += 1;
        }
        if let (Some(l), crate::proto::Message::Contribution(c)) = (self.lineages.as_mut(), &msg) {
            if c.origin == PeerId(i as u64) {
                l.published.insert(c.hash, (i, c.fragment as usize, c.round));
            }
        }
        self.gossip_from(i, PeerId(i as u64), msg.clone());
        self.observe_honest(i, &msg);
    }

    /// Gossips `msg` from peer `i`'s uplink, signed as `from` (itself, or a Sybil of it).
    pub(super) fn gossip_from(&mut self, i: usize, from: PeerId, msg: crate::proto::Message) {
        let len = gossip_len(&msg);
        self.bytes[i].gossip_sent += len;
        for j in 0..self.slots.len() {
            if j == i || self.slots[j].peer.is_none() {
                continue;
            }
            if let Some(at) = self.net.gossip(&mut self.rng, i, j, self.now) {
                self.bytes[j].gossip_received += len;
                let inc = self.slots[j].inc;
                let event = Event::Message { from, msg: msg.clone() };
                self.queue.push(at, Ev::Proto { peer: j, inc, event });
            }
        }
    }
}
