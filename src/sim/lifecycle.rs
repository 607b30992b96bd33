//! A simulated peer's life around its training, as the node lives it: a fresh peer that
//! joins a running swarm is held until its [`Peer`] releases it, a trainer with a step
//! target tells its peer when it is done, and the peer's own clock ([`Peer::poll`]) finishes
//! it once the swarm is quiet. The decisions are the peer's; this file only carries them
//! out on simulated time.

use rand::Rng;

use super::{Ev, Life, Sim, SimError};
use crate::peer::{Peer, PeerEvent, Release};
use crate::proto::{ApplyAnchor, PeerId, Protocol};

impl Sim {
    /// Starts a fresh peer in the empty slot `i` (crashed, or never alive): the run's
    /// initial weights, no checkpoint. Joining a swarm that has merged, it is held until it
    /// holds the swarm's anchors (or its wait ends), as `atoll run` holds a late joiner.
    pub fn join_fresh(&mut self, i: usize) -> Result<(), SimError> {
        if self.slots[i].peer.is_some() {
            return Ok(());
        }
        let seed: u64 = self.rng.random();
        let initial: Vec<Vec<f32>> = (0..self.plan.len())
            .map(|p| {
                let start = self.offsets[p];
                self.init[start..start + self.plan.fragments[p].numel()].to_vec()
            })
            .collect();
        let proto =
            Protocol::new(PeerId(i as u64), self.settings.clone(), &self.plan, initial, seed)?;
        let now = self.now + self.slots[i].skew;
        let late = (0..self.plan.len()).any(|p| proto.schedule().current_round(p, now) > 1);
        let slot = &mut self.slots[i];
        slot.trainer.theta.copy_from_slice(&self.init);
        slot.trainer.resume_at(self.now);
        slot.trainer.steps = 0;
        slot.snap_steps = vec![0; self.plan.len()];
        slot.held = late;
        slot.life = Life::default();
        slot.peer = Some(Peer::new(proto, self.settings.period_ms(), late.then_some(now)));
        slot.inc += 1;
        self.start_peer(i);
        Ok(())
    }

    /// What peer `i`'s life brought so far.
    pub fn life(&self, i: usize) -> &Life {
        &self.slots[i].life
    }

    /// Queues the peer's next poll, unless an earlier one is queued.
    pub(super) fn schedule_poll(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        let Some(at) = slot.peer.as_ref().and_then(Peer::next_poll) else { return };
        // Never at the same instant again: a poll that decided nothing must not spin.
        let at = at.saturating_sub(slot.skew).max(self.now + 1);
        if slot.poll_at.is_some_and(|queued| queued <= at && queued >= self.now) {
            return;
        }
        slot.poll_at = Some(at);
        self.queue.push(at, Ev::Poll { peer: i, inc: slot.inc });
    }

    pub(super) fn poll(&mut self, i: usize) {
        let now = self.now + self.slots[i].skew;
        self.slots[i].poll_at = None;
        let Some(p) = self.slots[i].peer.as_mut() else { return };
        let effects = p.poll(now);
        self.carry_out(i, effects);
    }

    /// Queues the moment the trainer of `i` completes its step target (not while held:
    /// its clock stands still until release).
    pub(super) fn schedule_trained(&mut self, i: usize) {
        let slot = &self.slots[i];
        let Some(target) = slot.trainer.limit else { return };
        if slot.held || slot.life.trained_at.is_some() {
            return;
        }
        let at = slot.trainer.time_of_step(target).max(self.now);
        self.queue.push(at, Ev::Trained { peer: i, inc: slot.inc });
    }

    pub(super) fn trained(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.trainer.advance(self.now, &self.problem);
        slot.life.trained_at = Some(self.now);
        let now = self.now + slot.skew;
        let Some(p) = slot.peer.as_mut() else { return };
        let effects = p.handle(PeerEvent::Trained, now);
        self.carry_out(i, effects);
    }

    /// A held joiner's trainer starts from the anchors it holds now.
    pub(super) fn release(&mut self, i: usize, r: Release) {
        let slot = &mut self.slots[i];
        slot.held = false;
        slot.trainer.resume_at(self.now);
        slot.life.released = Some((self.now, r, slot.trainer.steps));
        self.schedule_trained(i);
    }

    /// The final anchors go into the model and the trainer stops.
    pub(super) fn finish(&mut self, i: usize, anchors: Vec<ApplyAnchor>) {
        let slot = &mut self.slots[i];
        slot.trainer.advance(self.now, &self.problem);
        for a in &anchors {
            let start = self.offsets[a.fragment];
            slot.trainer.apply(start..start + a.anchor.len(), &a.anchor, a.alpha);
        }
        slot.held = true;
        let anchors = anchors.into_iter().flat_map(|a| a.anchor).collect();
        slot.life.finished = Some((self.now, anchors));
    }
}
