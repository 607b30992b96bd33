//! Carrying out the peer's release and finish (the decisions are `crate::peer`'s): a held
//! late joiner's trainer starts; a finishing peer's final anchors go into the model, then
//! the trainer evaluates, checkpoints and stops.

use super::worker::ToWorker;
use super::{Loop, Network};
use crate::peer::Release;
use crate::proto::ApplyAnchor;

impl<N: Network> Loop<N> {
    /// Final anchors into the model, then the worker evaluates, checkpoints and stops.
    pub(super) async fn finish(&mut self, anchors: Vec<ApplyAnchor>) {
        if !anchors.is_empty() {
            tracing::info!("trained and the swarm is quiet; finishing");
        }
        for a in anchors {
            self.to_worker.push(ToWorker::Apply(a));
        }
        self.to_worker.push(ToWorker::Finish);
    }

    /// A held late joiner takes its first step.
    pub(super) async fn release(&mut self, r: Release) {
        let rounds = &r.rounds;
        if r.caught_up {
            tracing::info!(?rounds, "holding the swarm's anchors; training starts");
        } else if !r.heard_any {
            // A new swarm (every peer of the default run, epoch 0, starts "late"): nothing
            // to catch up with, and nothing wrong.
            tracing::info!(
                "no peer has announced a state yet: training from the run's initial weights"
            );
        } else {
            tracing::warn!(?rounds, "not caught up with the swarm in time; training starts anyway");
        }
        let released = self.clock.unix_ms().saturating_sub(self.started_unix_ms);
        self.status.release_ms = Some(released);
        self.to_worker.push(ToWorker::Start);
    }

    pub(super) fn save_anchors(&self) {
        let proto = self.peer.protocol();
        for p in 0..proto.settings().raw().fragments {
            self.disk.save_state(proto.state(p).clone());
        }
    }
}
