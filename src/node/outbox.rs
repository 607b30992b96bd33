//! Commands to the trainer thread, queued on the node's side: the node never waits for
//! the trainer.
//!
//! The trainer takes commands between two steps and answers snapshots with a blocking
//! send. When the node also waited to send (both channels bounded), a trainer in a long
//! step — a GPU peer compiling its kernels on a loaded machine took 33 s for its first
//! one — let the command channel fill; the node then blocked sending while the trainer,
//! taking commands again, blocked answering: a deadlock that stopped the peer for good.
//! So the node hands commands over without waiting, and while the trainer is behind, the
//! commands for one fragment coalesce: only the newest snapshot request is answered (with
//! the steps taken since the last one), and anchors to apply collapse into the newest one
//! with the smallest blending weight (an adoption's 0 replaces the local parameters), and
//! only the newest state to weigh is weighed. The queue holds at most three commands per
//! fragment, plus start, stop and finish.

use std::collections::VecDeque;

use tokio::sync::mpsc;

use super::worker::ToWorker;

pub(super) struct WorkerOutbox {
    tx: mpsc::Sender<ToWorker>,
    queue: VecDeque<ToWorker>,
}

impl WorkerOutbox {
    pub fn new(tx: mpsc::Sender<ToWorker>) -> Self {
        Self { tx, queue: VecDeque::new() }
    }

    /// Queues `cmd` (coalescing it with a queued one of its fragment) and hands over what
    /// the channel has room for. `false` if the trainer is gone.
    pub fn push(&mut self, cmd: ToWorker) -> bool {
        if self.tx.is_closed() {
            self.queue.clear();
            return false;
        }
        if let Some(cmd) = self.coalesce(cmd) {
            self.queue.push_back(cmd);
        }
        self.flush();
        true
    }

    /// Merges `cmd` into a queued command of the same kind and fragment; gives it back if
    /// there is none.
    fn coalesce(&mut self, cmd: ToWorker) -> Option<ToWorker> {
        match cmd {
            ToWorker::Snapshot { fragment, round } => {
                for queued in &mut self.queue {
                    if let ToWorker::Snapshot { fragment: f, round: r } = queued {
                        if *f == fragment {
                            *r = (*r).max(round);
                            return None;
                        }
                    }
                }
                Some(ToWorker::Snapshot { fragment, round })
            }
            ToWorker::Apply(a) => {
                for queued in &mut self.queue {
                    if let ToWorker::Apply(q) = queued {
                        if q.fragment == a.fragment {
                            let alpha = q.alpha.min(a.alpha);
                            *q = a;
                            q.alpha = alpha;
                            return None;
                        }
                    }
                }
                Some(ToWorker::Apply(a))
            }
            ToWorker::Weigh { fragment, hash, anchor, own, margin } => {
                // The core weighs one state per fragment at a time: a newer one replaces it.
                for queued in &mut self.queue {
                    if let ToWorker::Weigh { fragment: f, .. } = queued {
                        if *f == fragment {
                            *queued = ToWorker::Weigh { fragment, hash, anchor, own, margin };
                            return None;
                        }
                    }
                }
                Some(ToWorker::Weigh { fragment, hash, anchor, own, margin })
            }
            other => Some(other),
        }
    }

    /// Hands over queued commands while the channel has room.
    pub fn flush(&mut self) {
        while let Some(cmd) = self.queue.pop_front() {
            match self.tx.try_send(cmd) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(cmd)) => {
                    self.queue.push_front(cmd);
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    self.queue.clear();
                    return;
                }
            }
        }
    }

    /// Whether commands wait for room in the channel.
    pub fn waiting(&self) -> bool {
        !self.queue.is_empty()
    }

    /// A sender to wait on for room (`reserve`) while commands are waiting.
    pub fn sender(&self) -> mpsc::Sender<ToWorker> {
        self.tx.clone()
    }

    /// Drops the queue and the sender: a trainer thread still running sees its command
    /// channel closed and ends.
    pub fn close(&mut self) {
        self.queue.clear();
        self.tx = mpsc::channel(1).0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ApplyAnchor;

    fn apply(fragment: usize, round: u64, alpha: f32) -> ToWorker {
        ToWorker::Apply(ApplyAnchor { fragment, round, anchor: vec![round as f32], alpha })
    }

    /// A trainer stuck in a long step: the node's commands never block, the queue stays
    /// bounded by coalescing, and what the trainer finally reads is the newest of each.
    #[test]
    fn a_busy_trainer_gets_the_newest_commands_without_the_node_waiting() {
        let (tx, mut rx) = mpsc::channel(2);
        let mut out = WorkerOutbox::new(tx);
        for round in 1..=1000 {
            for fragment in 0..4 {
                assert!(out.push(ToWorker::Snapshot { fragment, round }));
                let alpha = if round == 500 { 0.0 } else { 0.5 };
                assert!(out.push(apply(fragment, round, alpha)));
            }
            assert!(out.queue.len() <= 8, "round {round}: {} queued", out.queue.len());
        }
        assert!(out.push(ToWorker::Finish));
        let mut got = Vec::new();
        while out.waiting() || !rx.is_empty() {
            while let Ok(cmd) = rx.try_recv() {
                got.push(cmd);
            }
            out.flush();
        }
        // The two the channel took at once (fragment 0's first), then the newest of each
        // per fragment, then Finish.
        let snapshots: Vec<(usize, u64)> = got
            .iter()
            .filter_map(|c| match c {
                ToWorker::Snapshot { fragment, round } => Some((*fragment, *round)),
                _ => None,
            })
            .collect();
        assert_eq!(snapshots, [(0, 1), (1, 1000), (2, 1000), (3, 1000), (0, 1000)]);
        for f in 0..4 {
            let a = got.iter().rev().find_map(|c| match c {
                ToWorker::Apply(a) if a.fragment == f => Some(a),
                _ => None,
            });
            let a = a.unwrap();
            assert_eq!((a.round, a.anchor[0], a.alpha), (1000, 1000.0, 0.0), "fragment {f}");
        }
        assert!(matches!(got.last(), Some(ToWorker::Finish)));
        drop(rx);
        assert!(!out.push(ToWorker::Start), "a closed channel is reported");
    }

    /// While the trainer is busy, a newer state to weigh for a fragment replaces the queued
    /// one (the core weighs one per fragment and ignores answers about the others).
    #[test]
    fn only_the_newest_state_of_a_fragment_is_weighed() {
        let (tx, mut rx) = mpsc::channel(1);
        let mut out = WorkerOutbox::new(tx);
        let weigh = |fragment, h: u8| ToWorker::Weigh {
            fragment,
            hash: crate::delta::ContentHash([h; 32]),
            anchor: vec![f32::from(h)],
            own: vec![0.0],
            margin: 0.02,
        };
        assert!(out.push(ToWorker::Start));
        for (fragment, h) in [(0, 1), (1, 2), (0, 3), (0, 4)] {
            assert!(out.push(weigh(fragment, h)));
        }
        let mut got = Vec::new();
        while out.waiting() || !rx.is_empty() {
            while let Ok(cmd) = rx.try_recv() {
                got.push(cmd);
            }
            out.flush();
        }
        let weighed: Vec<(usize, u8, f32)> = got
            .iter()
            .filter_map(|c| match c {
                ToWorker::Weigh { fragment, hash, anchor, .. } => {
                    Some((*fragment, hash.0[0], anchor[0]))
                }
                _ => None,
            })
            .collect();
        assert_eq!(weighed, [(0, 4, 4.0), (1, 2, 2.0)]);
    }
}
