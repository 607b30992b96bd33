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

    /// The fetch contract of [`Output::Fetch`], as atoll-net keeps it: the holders in the
    /// order given, each until it answers or an attempt times out (`fetch_timeout_ms`),
    /// payloads checked against their hash, until one delivers or the deadline passes;
    /// then exactly one answer (none after the deadline: the core gives up by itself).
    /// Payloads are immutable by hash, so each answer is computed now and only its timing
    /// is simulated.
    fn fetch(
        &mut self,
        requester: usize,
        inc: u32,
        hash: ContentHash,
        holders: &[PeerId],
        max_len: u64,
        deadline: u64,
    ) {
        let attempt = self.settings().raw().fetch_timeout_ms;
        let mut t = self.now;
        let mut asked = None;
        for &holder in holders {
            let Some(server) = super::byzantine::server_of(holder, self.slots.len()) else {
                continue;
            };
            if t >= deadline {
                return;
            }
            asked = Some(holder);
            let Some(arrive) = self.net.small(&mut self.rng, requester, server, t) else {
                t = t.saturating_add(attempt);
                continue;
            };
            let Some(p) = self.slots[server].proto.as_ref() else {
                t = t.saturating_add(attempt);
                continue;
            };
            let bytes = self.byz.serve(server, &hash).or_else(|| p.serve(&hash));
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
                    let refused = self.net.small(&mut self.rng, server, requester, arrive);
                    t = refused.unwrap_or(t.saturating_add(attempt));
                }
            }
        }
        if let Some(from) = asked.filter(|_| t < deadline) {
            let event = Event::FetchFailed { from, hash };
            self.queue.push(t, Ev::Proto { peer: requester, inc, event });
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
