//! The board: what the status page and `/metrics` show, kept in memory and fed by the
//! peer as it writes `status.json` (no request reads the disk).
//!
//! It holds the latest status snapshot (the same [`StatusFile`] that `status.json` gets)
//! and two bounded curves, loss and `val_bpb` by step. A curve that reaches
//! [`MAX_POINTS`] keeps every other point and from then on takes one point in two (one in
//! four after the next halving, …), so it spans the whole run at a bounded size; its last
//! point is always the latest value. It also compares the run peers' heartbeats with this
//! peer's recent states, for the page's consensus column ([`super::consensus`]).

use std::sync::{Arc, Mutex, MutexGuard};

use atoll_net::NetStats;
use serde::Serialize;

use super::consensus::{self, OwnAnchors, PeerAgreement};
use crate::heartbeat::table::PeerEntry;
use crate::rundir::status::{self, Endpoints, StatusFile, TrainingStatus};

/// Most points of one curve.
pub const MAX_POINTS: usize = 2_000;

/// A point of a curve: inner step and value (`[step, value]` in JSON).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub step: u64,
    pub value: f64,
}

impl Serialize for Point {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (self.step, self.value).serialize(s)
    }
}

/// A curve bounded to [`MAX_POINTS`], thinned evenly as it grows.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Curve {
    points: Vec<Point>,
    /// One point kept in `stride` (doubles at each halving).
    #[serde(skip)]
    stride: u64,
    /// Points offered so far.
    #[serde(skip)]
    offered: u64,
    /// The last point is the latest value but not one the stride keeps: the next one
    /// replaces it.
    #[serde(skip)]
    tail_provisional: bool,
}

impl Curve {
    /// Adds a point. Non-finite values are left out; a step at or before the last point's
    /// drops the points it went back over.
    pub fn push(&mut self, step: u64, value: f64) {
        if !value.is_finite() {
            return;
        }
        // A peer that adopted an older state or resumed from an earlier checkpoint goes
        // back in steps: drop the points it went back over, so the curve stays a function.
        while self.points.last().is_some_and(|p| p.step >= step) {
            self.points.pop();
            self.tail_provisional = false;
        }
        if self.tail_provisional {
            self.points.pop();
        }
        self.offered += 1;
        let stride = self.stride.max(1);
        self.points.push(Point { step, value });
        self.tail_provisional = self.offered % stride != 0;
        if self.points.len() > MAX_POINTS {
            self.halve();
        }
    }

    /// Keeps every other point (and the last), and takes one point in twice as many.
    fn halve(&mut self) {
        let last = self.points.last().copied();
        let mut i = 0;
        self.points.retain(|_| {
            i += 1;
            i % 2 == 1
        });
        if let Some(last) = last {
            if self.points.last() != Some(&last) {
                self.points.push(last);
            }
        }
        self.stride = self.stride.max(1).saturating_mul(2);
        self.tail_provisional = false;
    }

    pub fn points(&self) -> &[Point] {
        &self.points
    }
}

/// The curves of `/api/history`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct History {
    /// Training loss (nats per byte) of each inner step, thinned.
    pub loss: Curve,
    /// Validation bits per byte of each validation pass, thinned.
    pub val_bpb: Curve,
}

#[derive(Debug, Default)]
struct State {
    status: Option<StatusFile>,
    history: History,
    endpoints: Endpoints,
    own: OwnAnchors,
    swarm: Vec<PeerAgreement>,
}

/// `/api/status`: the status file, and the run peers' states compared with ours.
#[derive(Serialize)]
struct PageStatus<'a> {
    #[serde(flatten)]
    status: &'a StatusFile,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    swarm: &'a [PeerAgreement],
}

/// The shared board: cheap to clone; every clone sees the same state.
#[derive(Debug, Clone, Default)]
pub struct Board {
    state: Arc<Mutex<State>>,
}

impl Board {
    pub fn new() -> Board {
        Board::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The latest status, as written to `status.json`.
    pub fn set_status(&self, running: bool, stats: NetStats, training: Option<TrainingStatus>) {
        let mut s = self.lock();
        if let Some(t) = &training {
            s.own.record(&t.round, &t.anchor_hashes);
        }
        let endpoints = s.endpoints.clone();
        s.status = Some(StatusFile {
            running,
            pid: std::process::id(),
            updated_unix_ms: status::unix_ms(),
            stats,
            training,
            endpoints,
        });
    }

    /// The run peers' latest heartbeats (`swarm.json`'s peers): their states against ours.
    pub fn set_swarm(&self, peers: &[PeerEntry]) {
        let mut s = self.lock();
        s.swarm = consensus::compare(&s.own, peers);
    }

    /// `/api/status`'s JSON (`None` before the peer's first status).
    pub(crate) fn page_status_json(&self) -> Option<serde_json::Result<Vec<u8>>> {
        let s = self.lock();
        let status = s.status.as_ref()?;
        Some(serde_json::to_vec(&PageStatus { status, swarm: &s.swarm }))
    }

    /// An inner step's training loss.
    pub fn record_loss(&self, step: u64, loss: f64) {
        self.lock().history.loss.push(step, loss);
    }

    /// A validation pass's bits per byte.
    pub fn record_val_bpb(&self, step: u64, val_bpb: f64) {
        self.lock().history.val_bpb.push(step, val_bpb);
    }

    /// Where the servers listen (set once they are bound).
    pub fn set_endpoints(&self, endpoints: Endpoints) {
        let mut s = self.lock();
        if let Some(st) = s.status.as_mut() {
            st.endpoints = endpoints.clone();
        }
        s.endpoints = endpoints;
    }

    pub fn endpoints(&self) -> Endpoints {
        self.lock().endpoints.clone()
    }

    /// The latest status (`None` before the peer's first status).
    pub fn status(&self) -> Option<StatusFile> {
        self.lock().status.clone()
    }

    pub fn history(&self) -> History {
        self.lock().history.clone()
    }

    /// Runs `f` on the latest status without copying it.
    pub(crate) fn with_status<R>(&self, f: impl FnOnce(Option<&StatusFile>) -> R) -> R {
        f(self.lock().status.as_ref())
    }

    /// Runs `f` on the history without copying it.
    pub(crate) fn with_history<R>(&self, f: impl FnOnce(&History) -> R) -> R {
        f(&self.lock().history)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_curve_stays_bounded_spans_the_run_and_ends_at_the_latest_point() {
        let mut c = Curve::default();
        for step in 1..=100_000u64 {
            c.push(step, step as f64);
            assert!(c.points().len() <= MAX_POINTS, "at step {step}");
            assert_eq!(c.points().last().unwrap().step, step);
        }
        let p = c.points();
        assert_eq!(p[0].step, 1);
        assert!(p.len() > MAX_POINTS / 4, "{} points", p.len());
        assert!(p.windows(2).all(|w| w[0].step < w[1].step));
        // Evenly thinned: no gap much wider than the stride.
        let widest = p.windows(2).map(|w| w[1].step - w[0].step).max().unwrap();
        assert!(widest <= 2 * 100_000 / (MAX_POINTS as u64 / 2), "gap {widest}");
    }

    #[test]
    fn a_curve_skips_non_finite_values_and_restarts_its_tail_when_steps_go_back() {
        let mut c = Curve::default();
        for step in 1..=10 {
            c.push(step, 1.0);
        }
        c.push(11, f64::NAN);
        c.push(12, f64::INFINITY);
        assert_eq!(c.points().len(), 10);
        c.push(5, 2.0);
        assert_eq!(c.points().iter().map(|p| p.step).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
        assert_eq!(c.points()[4].value, 2.0);
    }

    #[test]
    fn the_board_keeps_the_latest_status_with_its_endpoints() {
        let b = Board::new();
        assert!(b.status().is_none());
        let training = TrainingStatus { step: 7, ..Default::default() };
        b.set_status(true, NetStats::default(), Some(training));
        b.set_endpoints(Endpoints { http_addr: Some("127.0.0.1:1".into()), metrics_addr: None });
        let s = b.status().unwrap();
        assert_eq!(s.training.unwrap().step, 7);
        assert_eq!(s.endpoints.http_addr.as_deref(), Some("127.0.0.1:1"));
    }

    #[test]
    fn the_page_status_carries_the_peers_agreement_once_heartbeats_came() {
        let b = Board::new();
        let training = |round: u64| TrainingStatus {
            round: vec![round],
            anchor_hashes: vec!["ab".repeat(32)],
            ..Default::default()
        };
        b.set_status(true, NetStats::default(), Some(training(3)));
        let json = String::from_utf8(b.page_status_json().unwrap().unwrap()).unwrap();
        assert!(!json.contains("\"swarm\""), "{json}");
        let peer = consensus::test_entry("p", &[3], &[&"ab".repeat(6)]);
        b.set_swarm(&[peer]);
        let json = String::from_utf8(b.page_status_json().unwrap().unwrap()).unwrap();
        assert!(json.contains(r#""swarm":[{"peer":"p","rounds":[3],"agree":[true]}]"#), "{json}");
    }
}
