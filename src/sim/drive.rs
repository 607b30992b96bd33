//! Carrying out the protocol's outputs inside the simulation.

use super::{gossip_len, Ev, Sim};
use crate::delta::ContentHash;
use crate::proto::{Event, Output, PeerId};

impl Sim {
    pub(super) fn start_peer(&mut self, i: usize) {
        let now = self.peer_now(i);
        if let Some(p) = self.slots[i].proto.as_mut() {
            let outs = p.start(now);
            self.carry_out(i, outs);
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
        }
    }

    fn feed(&mut self, i: usize, event: Event) {
        let now = self.peer_now(i);
        let Some(p) = self.slots[i].proto.as_mut() else { return };
        let outs = p.handle(event, now);
        self.carry_out(i, outs);
    }

    /// The reply to a request reaching `server` at `arrive`.
    fn serve(
        &mut self,
        server: usize,
        requester: usize,
        inc: u32,
        hash: ContentHash,
        max_len: u64,
        arrive: u64,
    ) {
        let Some(p) = self.slots[server].proto.as_ref() else { return };
        let from = PeerId(server as u64);
        let reply = match self.byz.serve(server, &hash).or_else(|| p.serve(&hash)) {
            Some(bytes) if bytes.len() as u64 <= max_len => {
                let len = bytes.len();
                let at = self.net.bulk(&mut self.rng, server, requester, arrive, len);
                self.bytes[server].payload_sent += len as u64;
                at.map(|at| {
                    self.bytes[requester].payload_received += len as u64;
                    (at, Event::Fetched { from, hash, bytes })
                })
            }
            _ => {
                let at = self.net.small(&mut self.rng, server, requester, arrive);
                at.map(|at| (at, Event::FetchFailed { from, hash }))
            }
        };
        if let Some((at, event)) = reply {
            self.queue.push(at, Ev::Proto { peer: requester, inc, event });
        }
    }

    /// Carries out `outs` of peer `i`.
    fn carry_out(&mut self, i: usize, outs: Vec<Output>) {
        for o in outs {
            self.output(i, o);
        }
    }

    fn snapshot(&mut self, i: usize, fragment: usize, round: u64) -> Event {
        let slot = &mut self.slots[i];
        slot.trainer.advance(self.now, &self.problem);
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
            Output::Broadcast(msg) if self.byz.is_hostile(i) => self.hostile_broadcast(i, msg),
            Output::Broadcast(msg) => self.broadcast(i, msg),
            Output::Fetch { from, hash, max_len, .. } => {
                // The server answers when the request arrives; payloads are immutable by
                // hash, so the answer is computed now and only its timing is simulated
                // (one queue event per fetch instead of two).
                if let Some(server) = super::byzantine::server_of(from, self.slots.len()) {
                    if let Some(at) = self.net.small(&mut self.rng, i, server, self.now) {
                        self.serve(server, i, inc, hash, max_len, at);
                    }
                }
            }
            Output::SetTimer { at, timer } => {
                let at = at.saturating_sub(self.slots[i].skew).max(self.now);
                self.queue.push(at, Ev::Proto { peer: i, inc, event: Event::Timer(timer) });
            }
            Output::Snapshot { fragment, round } => {
                let at = self.slots[i].trainer.step_end(self.now);
                self.queue.push(at, Ev::Snapshot { peer: i, inc, fragment, round });
            }
            Output::Apply(a) => {
                let slot = &mut self.slots[i];
                slot.trainer.advance(self.now, &self.problem);
                let start = self.offsets[a.fragment];
                slot.trainer.apply(start..start + a.anchor.len(), &a.anchor, a.alpha);
            }
            Output::Merged(r) => {
                self.stats.merges += 1;
                self.stats.max_waited_ms = self.stats.max_waited_ms.max(r.waited_ms);
                self.stats.grace_sum_ms += r.grace_ms;
                self.stats.merged_contributions += r.merged.len() as u64;
                self.stats.late_merged += r.late as u64;
                if let Some(l) = self.lineages.as_mut() {
                    l.merged(i, &r, &mut self.stats);
                }
            }
            Output::Skipped { .. } => self.stats.skipped += 1,
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

    fn broadcast(&mut self, i: usize, msg: crate::proto::Message) {
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
            if j == i || self.slots[j].proto.is_none() {
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
