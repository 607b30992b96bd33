//! The run dir's files written by the node (fragment states and residuals, `status.json`,
//! `swarm.json`, `merges.jsonl`) go through one thread of their own, so the event loop never waits on
//! the disk.
//!
//! Only the newest state of each fragment, status and swarm table wait to be written (a
//! newer one replaces them), so the backlog stays bounded however slow the disk; merge
//! records queue in order, at most [`MAX_MERGES`] (older ones beyond that are dropped and
//! counted in the log). [`Disk::finish`] writes what is pending and returns once it is on
//! disk.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use atoll_net::NetStats;

use crate::heartbeat::table::SwarmView;
use crate::proto::{FragmentState, MergeReport};
use crate::rundir::{anchors, ledger, status, swarm};

/// Most merge records waiting to be appended.
pub const MAX_MERGES: usize = 4096;

/// The node's writer of its run dir.
pub struct Disk {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
}

#[derive(Default)]
struct Pending {
    states: BTreeMap<u32, FragmentState>,
    residuals: BTreeMap<u32, Vec<f32>>,
    status: Option<(bool, NetStats, Option<status::TrainingStatus>)>,
    swarm: Option<SwarmView>,
    merges: Vec<(u64, MergeReport)>,
    dropped_merges: u64,
    closed: bool,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.states.is_empty()
            && self.residuals.is_empty()
            && self.status.is_none()
            && self.swarm.is_none()
            && self.merges.is_empty()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Disk {
    /// `endpoints`: where the status page and metrics are served, named in `status.json`.
    pub fn start(run_dir: PathBuf, endpoints: status::Endpoints) -> std::io::Result<Disk> {
        let shared =
            Arc::new(Shared { pending: Mutex::new(Pending::default()), wake: Condvar::new() });
        let theirs = shared.clone();
        let thread = std::thread::Builder::new()
            .name("atoll-disk".into())
            .spawn(move || write_pending(run_dir, &endpoints, &theirs))?;
        Ok(Disk { shared, thread: Some(thread) })
    }

    fn update(&self, f: impl FnOnce(&mut Pending)) {
        f(&mut self.shared.lock());
        self.shared.wake.notify_one();
    }

    /// Queues a fragment's state, replacing an older pending state of that fragment.
    pub fn save_state(&self, state: FragmentState) {
        self.update(|p| {
            p.states.insert(state.fragment, state);
        });
    }

    /// Queues a fragment's error-feedback residual, replacing an older pending one.
    pub fn save_residual(&self, fragment: u32, residual: Vec<f32>) {
        self.update(|p| {
            p.residuals.insert(fragment, residual);
        });
    }

    /// Queues `status.json`, replacing an older pending one.
    pub fn write_status(&self, running: bool, stats: NetStats, training: status::TrainingStatus) {
        self.update(|p| p.status = Some((running, stats, Some(training))));
    }

    /// Queues `status.json` of a peer that does not train.
    pub fn write_net_status(&self, running: bool, stats: NetStats) {
        self.update(|p| p.status = Some((running, stats, None)));
    }

    /// Queues `swarm.json`, replacing an older pending one.
    pub fn write_swarm(&self, view: SwarmView) {
        self.update(|p| p.swarm = Some(view));
    }

    /// Queues a line of `merges.jsonl`.
    pub fn record_merge(&self, unix_ms: u64, report: MergeReport) {
        self.update(|p| {
            if p.merges.len() < MAX_MERGES {
                p.merges.push((unix_ms, report));
            } else {
                p.dropped_merges += 1;
            }
        });
    }

    /// Writes what is pending, then stops the thread.
    pub fn finish(mut self) {
        self.close();
    }

    fn close(&mut self) {
        self.update(|p| p.closed = true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        self.close();
    }
}

fn write_pending(run_dir: PathBuf, endpoints: &status::Endpoints, shared: &Shared) {
    let mut ledger = ledger::Ledger::new(&run_dir);
    let status_path = run_dir.join(status::FILE_NAME);
    let swarm_path = run_dir.join(swarm::FILE_NAME);
    loop {
        let (batch, closed) = {
            let mut pending = shared.lock();
            while pending.is_empty() && !pending.closed {
                pending = shared.wake.wait(pending).unwrap_or_else(|p| p.into_inner());
            }
            let closed = pending.closed;
            (std::mem::take(&mut *pending), closed)
        };
        if batch.dropped_merges > 0 {
            tracing::warn!(
                dropped = batch.dropped_merges,
                "the disk fell behind; merge records dropped"
            );
        }
        for (unix_ms, report) in &batch.merges {
            ledger.record(*unix_ms, report);
        }
        for state in batch.states.values() {
            if let Err(e) = anchors::save(&run_dir, state) {
                tracing::error!(error = %e, "cannot save anchors; training goes on");
            }
        }
        for (fragment, residual) in &batch.residuals {
            if let Err(e) = anchors::save_residual(&run_dir, *fragment, residual) {
                tracing::error!(error = %e, "cannot save the error-feedback residual");
            }
        }
        if let Some(view) = &batch.swarm {
            if let Err(e) = swarm::write(&swarm_path, view) {
                tracing::warn!(path = %swarm_path.display(), error = %e, "cannot write swarm.json");
            }
        }
        if let Some((running, stats, training)) = batch.status {
            let endpoints = endpoints.clone();
            if let Err(e) = status::write_with(&status_path, running, stats, training, endpoints) {
                tracing::warn!(path = %status_path.display(), error = %e, "cannot write status.json");
            }
        }
        if closed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fragment::{FragmentPlan, TensorSpec};

    #[test]
    fn the_newest_state_status_and_every_merge_reach_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let tensors = vec![TensorSpec { name: "w".into(), shape: vec![4], is_embedding: false }];
        let plan = FragmentPlan::new(&tensors, 1).unwrap();
        let disk = Disk::start(dir.path().to_owned(), status::Endpoints::default()).unwrap();
        let mut last = FragmentState::initial(0, vec![0.0; 4]);
        for round in 1..=50 {
            last = FragmentState::initial(0, vec![round as f32; 4]);
            last.round = round;
            disk.save_state(last.clone());
            let report = MergeReport {
                fragment: 0,
                round,
                state_hash: crate::delta::ContentHash([0; 32]),
                merged: Vec::new(),
                contributions: Vec::new(),
                late: 0,
                since_open_ms: 0,
                waited_ms: 0,
                grace_ms: 0,
            };
            disk.record_merge(round, report);
            let training = status::TrainingStatus { step: round, ..Default::default() };
            disk.write_status(true, NetStats::default(), training);
        }
        disk.finish();
        assert_eq!(anchors::load(dir.path(), &plan).unwrap(), Some(vec![last]));
        let merges = ledger::read(dir.path()).unwrap();
        assert_eq!(
            merges.iter().map(|m| m.round).collect::<Vec<_>>(),
            (1..=50).collect::<Vec<_>>()
        );
        let st = status::read(&dir.path().join(status::FILE_NAME)).unwrap();
        assert_eq!(st.training.unwrap().step, 50);
    }
}
