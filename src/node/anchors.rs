//! The protocol's replicated fragment states on disk (`RUN_DIR/anchors/fragment-P.state`),
//! so a restarted peer resumes from its last merged anchors and momentum.
//!
//! Each file is the state's wire bytes followed by their blake3, written atomically.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use crate::checkpoint::write_atomic;
use crate::fragment::FragmentPlan;
use crate::proto::FragmentState;

/// Directory of the state files inside a run dir.
pub const DIR_NAME: &str = "anchors";

fn path(run_dir: &Path, fragment: usize) -> PathBuf {
    run_dir.join(DIR_NAME).join(format!("fragment-{fragment}.state"))
}

/// Writes one fragment's state.
pub fn save(run_dir: &Path, state: &FragmentState) -> std::io::Result<()> {
    let mut bytes = state.to_bytes();
    let hash = blake3::hash(&bytes);
    bytes.extend_from_slice(hash.as_bytes());
    write_atomic(&path(run_dir, state.fragment as usize), &bytes)
}

/// Saves states on a thread of its own, so the event loop never waits on the disk.
///
/// Only the newest state of each fragment waits to be written (a newer one replaces it),
/// so the backlog is at most one state per fragment however slow the disk.
/// [`Writer::finish`] writes what is pending and returns when it is on disk.
pub struct Writer {
    shared: Arc<(Mutex<Pending>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct Pending {
    states: BTreeMap<u32, FragmentState>,
    closed: bool,
}

impl Writer {
    pub fn start(run_dir: PathBuf) -> std::io::Result<Writer> {
        let shared = Arc::new((Mutex::new(Pending::default()), Condvar::new()));
        let theirs = shared.clone();
        let thread = std::thread::Builder::new()
            .name("atoll-anchors".into())
            .spawn(move || write_pending(&run_dir, &theirs))?;
        Ok(Writer { shared, thread: Some(thread) })
    }

    /// Queues `state` to be written, replacing an older pending state of its fragment.
    pub fn save(&self, state: FragmentState) {
        let (lock, wake) = &*self.shared;
        lock.lock().unwrap_or_else(|p| p.into_inner()).states.insert(state.fragment, state);
        wake.notify_one();
    }

    /// Writes what is pending, then stops the thread.
    pub fn finish(mut self) {
        self.close();
    }

    fn close(&mut self) {
        let (lock, wake) = &*self.shared;
        lock.lock().unwrap_or_else(|p| p.into_inner()).closed = true;
        wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.close();
    }
}

fn write_pending(run_dir: &Path, shared: &(Mutex<Pending>, Condvar)) {
    let (lock, wake) = shared;
    loop {
        let (batch, closed) = {
            let mut pending = lock.lock().unwrap_or_else(|p| p.into_inner());
            while pending.states.is_empty() && !pending.closed {
                pending = wake.wait(pending).unwrap_or_else(|p| p.into_inner());
            }
            (std::mem::take(&mut pending.states), pending.closed)
        };
        for state in batch.values() {
            if let Err(e) = save(run_dir, state) {
                tracing::error!(error = %e, "cannot save anchors; training goes on");
            }
        }
        if closed {
            return;
        }
    }
}

/// Loads every fragment's state. `Ok(None)` when the run dir holds none (a fresh peer);
/// an error names the file that is missing, truncated or corrupt.
pub fn load(run_dir: &Path, plan: &FragmentPlan) -> Result<Option<Vec<FragmentState>>, String> {
    if !run_dir.join(DIR_NAME).exists() {
        return Ok(None);
    }
    let mut states = Vec::with_capacity(plan.len());
    for spec in &plan.fragments {
        let p = path(run_dir, spec.id);
        let bytes = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        if bytes.len() < 32 {
            return Err(format!("{}: truncated", p.display()));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 32);
        if blake3::hash(body).as_bytes() != sum {
            return Err(format!("{}: checksum mismatch (corrupt or truncated)", p.display()));
        }
        let state =
            FragmentState::from_bytes(body, spec).map_err(|e| format!("{}: {e}", p.display()))?;
        states.push(state);
    }
    Ok(Some(states))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fragment::TensorSpec;

    #[test]
    fn round_trip_and_corruption_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let tensors = vec![
            TensorSpec { name: "emb".into(), shape: vec![8, 2], is_embedding: true },
            TensorSpec { name: "w".into(), shape: vec![3, 3], is_embedding: false },
        ];
        let plan = FragmentPlan::new(&tensors, 2).unwrap();
        assert_eq!(load(dir.path(), &plan).unwrap(), None);
        let states: Vec<FragmentState> = plan
            .fragments
            .iter()
            .map(|f| FragmentState::initial(f.id as u32, vec![0.5; f.numel()]))
            .collect();
        for s in &states {
            save(dir.path(), s).unwrap();
        }
        assert_eq!(load(dir.path(), &plan).unwrap(), Some(states));
        let f = path(dir.path(), 1);
        let mut bytes = std::fs::read(&f).unwrap();
        bytes[10] ^= 1;
        std::fs::write(&f, &bytes).unwrap();
        let e = load(dir.path(), &plan).unwrap_err();
        assert!(e.contains("checksum"), "{e}");
        std::fs::write(&f, &bytes[..5]).unwrap();
        assert!(load(dir.path(), &plan).unwrap_err().contains("truncated"));
    }

    #[test]
    fn the_writer_keeps_the_newest_state_of_each_fragment() {
        let dir = tempfile::tempdir().unwrap();
        let tensors = vec![TensorSpec { name: "w".into(), shape: vec![4], is_embedding: false }];
        let plan = FragmentPlan::new(&tensors, 1).unwrap();
        let writer = Writer::start(dir.path().to_owned()).unwrap();
        let mut last = FragmentState::initial(0, vec![0.0; 4]);
        for round in 1..=50 {
            last = FragmentState::initial(0, vec![round as f32; 4]);
            last.round = round;
            writer.save(last.clone());
        }
        writer.finish();
        assert_eq!(load(dir.path(), &plan).unwrap(), Some(vec![last]));
    }
}
