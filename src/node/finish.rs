//! How a peer finishes and how a late joiner is held: a trained peer merges until the
//! swarm is quiet, then applies its final anchors and has the trainer evaluate and
//! checkpoint; a fresh peer joining a running swarm waits for the swarm's anchors before
//! its first inner step.

use super::worker::ToWorker;
use super::{Loop, Network, QUIET_MARGIN_MS, QUIET_MIN_MS};
use crate::proto::Millis;

/// A joiner is caught up once each fragment's state is at most this many rounds behind the
/// round the run's clock is in (a merged state trails its open round by about one).
const MAX_ROUNDS_BEHIND_CLOCK: u64 = 2;

impl<N: Network> Loop<N> {
    pub(super) fn quiet_ms(&self) -> Millis {
        let grace = self.proto.settings().raw().grace_cap_ms;
        (self.period + grace + QUIET_MARGIN_MS).max(QUIET_MIN_MS)
    }

    /// Final anchors into the model, then the worker evaluates, checkpoints and stops.
    pub(super) async fn finish(&mut self) {
        self.finishing = true;
        if self.status.trained {
            for p in 0..self.proto.settings().raw().fragments {
                let anchor = self.proto.state(p).anchor.clone();
                let round = self.proto.state(p).round;
                let a = crate::proto::ApplyAnchor { fragment: p, round, anchor, alpha: 0.0 };
                let _ = self.to_worker.send(ToWorker::Apply(a)).await;
            }
        }
        let _ = self.to_worker.send(ToWorker::Finish).await;
    }

    /// Lets a held late joiner take its first step once every fragment caught up with the
    /// swarm, or when its wait is over (nobody answered: the run's initial anchors it is).
    pub(super) async fn release_if_caught_up(&mut self) {
        let Some(until) = self.holding else { return };
        let p = self.proto.settings().raw().fragments;
        let now = self.now();
        // Caught up with what we heard, and near the round the clock says the swarm is in:
        // a delta announcement heard before any state names an old base round, and must not
        // release a joiner that holds nothing yet.
        let near_clock = |i: usize| {
            let state = self.proto.state(i).round;
            state.saturating_add(MAX_ROUNDS_BEHIND_CLOCK)
                >= self.proto.schedule().current_round(i, now)
        };
        let caught_up = (0..p).all(|i| self.proto.caught_up(i) && near_clock(i));
        if !caught_up && now < until {
            return;
        }
        self.holding = None;
        let rounds: Vec<u64> = (0..p).map(|i| self.proto.state(i).round).collect();
        let heard_any = (0..p).any(|i| self.proto.heard_round(i) > 0);
        if caught_up {
            tracing::info!(?rounds, "holding the swarm's anchors; training starts");
        } else if !heard_any {
            // A new swarm (every peer of the default run, epoch 0, starts "late"): nothing
            // to catch up with, and nothing wrong.
            tracing::info!(
                "no peer has announced a state yet: training from the run's initial weights"
            );
        } else {
            tracing::warn!(?rounds, "not caught up with the swarm in time; training starts anyway");
        }
        let released = crate::rundir::status::unix_ms().saturating_sub(self.started_unix_ms);
        self.status.release_ms = Some(released);
        let _ = self.to_worker.send(ToWorker::Start).await;
    }

    pub(super) fn save_anchors(&self) {
        for p in 0..self.proto.settings().raw().fragments {
            self.disk.save_state(self.proto.state(p).clone());
        }
    }
}
