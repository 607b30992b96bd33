//! Self-diagnosis (`atoll doctor`, and the health line of `atoll status`): what is wrong
//! with a peer, in numbers, with a suggested fix.
//!
//! A pure function of two files the peer writes: `status.json` (its own counters, network
//! view and settings) and `swarm.json` (the run as heartbeats describe it). Durations are
//! measured at the files' own write times, so a stopped peer is diagnosed as it was. Other
//! peers' heartbeats may lie: they feed findings, nothing else, and the checks that use
//! them are robust to one liar where that is possible.
//!
//! The checks, each a [`Check`]:
//! - **no reachable peer**: no run peer connected for [`NO_PEER_AFTER_MS`];
//! - **behind NAT without relay**: AutoNAT says private and no relay reservation is held;
//! - **islands** (a warning): the gossip view and the connection view disagree for
//!   [`ISLAND_AFTER_MS`] — peers heard by heartbeat lately that discovery never connected
//!   (gossip reaches them through others: a DHT split, or NAT on both sides), or connected
//!   run peers whose heartbeats never arrive (the mesh does not carry them, or they run an
//!   atoll without heartbeats);
//! - **lagging rounds**: a fragment's round more than one behind the swarm's newest (the
//!   second-highest report when two or more peers report, so one liar cannot fake a lag);
//!   heartbeats are up to 5 s old, which makes the swarm look *behind*, never ahead;
//! - **clock** (training peers: the grace window is the manifest's): the swarm's clocks
//!   differ from ours by more than the grace window — a majority of heard peers beyond it
//!   in the same direction (robust to one liar from three peers on); offsets include the
//!   gossip delay;
//! - **manifest mismatch**: messages refused as another manifest's, or trainers whose
//!   heartbeats name another manifest;
//! - **upload cap**: `--max-upload-mbps` below what one period's deltas need: their bytes
//!   × the trainers that fetch them (heard peers of our manifest) ÷ the period.

mod net;

use std::collections::HashSet;

use serde::Serialize;

use crate::heartbeat::short_peer;
use crate::heartbeat::table::{PeerEntry, SwarmView};
use crate::rundir::status::{StatusFile, TrainingStatus};

/// A peer alone this long has no reachable peer.
pub const NO_PEER_AFTER_MS: u64 = 10_000;
/// The two views must disagree this long before islands are reported.
pub const ISLAND_AFTER_MS: u64 = 30_000;
/// A peer of a small run heard this recently (three heartbeats) is "heard lately";
/// larger runs space heartbeats out, and the window with them ([`fresh_ms`]).
pub const FRESH_MS: u64 = 15_000;

/// "Heard lately" in a view of `peers` peers: within three of their heartbeats.
pub fn fresh_ms(peers: usize) -> u64 {
    let every = crate::node::heartbeats::heartbeat_every(peers).as_millis();
    u64::try_from(3 * every).unwrap_or(u64::MAX).max(FRESH_MS)
}
/// A running peer's status older than this means it stopped writing it.
pub const STALE_STATUS_MS: u64 = 5_000;

/// How bad a finding is. `atoll doctor` exits non-zero on a problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing; the peer works.
    Warning,
    /// The peer does not train with the swarm as it should.
    Problem,
}

/// What was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    NotRunning,
    NoReachablePeer,
    NatWithoutRelay,
    Islands,
    LaggingRounds,
    Clock,
    ManifestMismatch,
    UploadCap,
}

impl Check {
    pub fn title(self) -> &'static str {
        match self {
            Check::NotRunning => "peer not running",
            Check::NoReachablePeer => "no reachable peer",
            Check::NatWithoutRelay => "behind NAT without a relay",
            Check::Islands => "split into islands",
            Check::LaggingRounds => "lagging rounds",
            Check::Clock => "clock disagrees with the swarm",
            Check::ManifestMismatch => "manifest mismatch",
            Check::UploadCap => "upload cap too low for the round period",
        }
    }
}

/// One thing found: what, how bad, what was seen (numbers) and what to do.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub check: Check,
    pub severity: Severity,
    pub title: &'static str,
    pub saw: String,
    pub fix: String,
}

fn finding(check: Check, severity: Severity, saw: String, fix: String) -> Finding {
    Finding { check, severity, title: check.title(), saw, fix }
}

/// True when no finding is a [`Severity::Problem`].
pub fn healthy(findings: &[Finding]) -> bool {
    findings.iter().all(|f| f.severity < Severity::Problem)
}

/// Everything found about the peer whose files these are, at `now_unix_ms` (used only to
/// tell a dead peer from a running one). Problems first.
pub fn diagnose(status: &StatusFile, swarm: Option<&SwarmView>, now_unix_ms: u64) -> Vec<Finding> {
    let mut out: Vec<Finding> = [
        not_running(status, now_unix_ms),
        net::no_reachable_peer(status, swarm),
        net::nat_without_relay(status),
        net::islands(swarm),
    ]
    .into_iter()
    .flatten()
    .collect();
    if let Some(t) = &status.training {
        let peers = swarm.map(fresh).unwrap_or_default();
        out.extend(lagging(t, &peers));
        out.extend(clock(t, &peers));
        out.extend(upload_cap(status, t, swarm.map(|_| peers.as_slice())));
    }
    out.extend(manifest_mismatch(status.training.as_ref(), swarm, now_unix_ms));
    out.sort_by_key(|f| std::cmp::Reverse(f.severity));
    out
}

/// Peers heard within [`fresh_ms`] of the view's write time.
fn fresh(v: &SwarmView) -> Vec<&PeerEntry> {
    let window = fresh_ms(v.peers.len());
    v.peers
        .iter()
        .filter(|p| v.updated_unix_ms.saturating_sub(p.received_unix_ms) <= window)
        .collect()
}

fn not_running(s: &StatusFile, now: u64) -> Option<Finding> {
    let age = now.saturating_sub(s.updated_unix_ms);
    if !s.running {
        let saw = format!("the peer stopped; its status was written {} ago", secs(age));
        let fix = "start it again (atoll run with the same --run-dir keeps its peer id); the \
                   findings below describe its last state"
            .to_owned();
        return Some(finding(Check::NotRunning, Severity::Warning, saw, fix));
    }
    (age > STALE_STATUS_MS).then(|| {
        let saw = format!(
            "status.json says running but was last written {} ago (every 0.5 s when alive)",
            secs(age)
        );
        let fix = format!(
            "the process (pid {}) probably died or hangs: check its log, then restart it",
            s.pid
        );
        finding(Check::NotRunning, Severity::Problem, saw, fix)
    })
}

/// Trainers of our manifest among `peers`.
fn same_run<'a>(t: &TrainingStatus, peers: &[&'a PeerEntry]) -> Vec<&'a PeerEntry> {
    peers
        .iter()
        .filter(|p| p.heartbeat.trains && p.heartbeat.manifest.as_deref() == Some(&t.run_id))
        .copied()
        .collect()
}

fn lagging(t: &TrainingStatus, peers: &[&PeerEntry]) -> Option<Finding> {
    let peers = same_run(t, peers);
    let mut lags = Vec::new();
    for (f, own) in t.round.iter().enumerate() {
        let mut reported: Vec<u64> =
            peers.iter().filter_map(|p| p.heartbeat.rounds.get(f).copied()).collect();
        reported.sort_unstable_by(|a, b| b.cmp(a));
        let Some(&newest) = reported.get(1.min(reported.len().saturating_sub(1))) else {
            continue;
        };
        if newest > own.saturating_add(1) {
            lags.push((f, *own, newest));
        }
    }
    let worst = lags.iter().max_by_key(|(_, own, newest)| newest - own)?;
    let saw = format!(
        "{} of {} more than one round behind the swarm's newest (reported by {}); worst: \
         fragment {} at round {}, the swarm at {}",
        lags.len(),
        count(t.round.len(), "fragment"),
        count(peers.len(), "peer"),
        worst.0,
        worst.1,
        worst.2
    );
    let fix = format!(
        "this peer merges later than the swarm; it catches up by adopting the swarm's state \
         ({} so far). If the lag stays, its downloads are too slow or the others' \
         deltas do not reach it: check `rejects` in `atoll status`, its download bandwidth, \
         and the islands check",
        count(t.adopted, "adoption")
    );
    Some(finding(Check::LaggingRounds, Severity::Problem, saw, fix))
}

fn clock(t: &TrainingStatus, peers: &[&PeerEntry]) -> Option<Finding> {
    if t.grace_ms == 0 || peers.is_empty() {
        return None;
    }
    let mut offsets: Vec<i64> = peers.iter().map(|p| p.clock_offset_ms).collect();
    offsets.sort_unstable();
    let n = offsets.len();
    // A strict majority beyond the window in one direction: the lower median is above it,
    // or the upper median below its negative.
    let (low, high) = (offsets[(n - 1) / 2], offsets[n / 2]);
    let grace = i64::try_from(t.grace_ms).unwrap_or(i64::MAX);
    let (median, way) = if low > grace {
        (low, "ahead of")
    } else if high < -grace {
        (high, "behind")
    } else {
        return None;
    };
    let saw = format!(
        "the swarm's clocks are {} {way} this peer's (median of {}, gossip delay \
         included; range {} to {}) — more than the grace window of {} ms",
        secs(median.unsigned_abs()),
        count(n, "peer"),
        signed_ms(offsets[0]),
        signed_ms(offsets[n - 1]),
        t.grace_ms
    );
    let fix = "synchronise this machine's clock (NTP: `timedatectl set-ntp true`, chrony or \
               ntpd): rounds open at fixed wall-clock times, so a peer whose clock is off \
               publishes its deltas outside the others' rounds"
        .to_owned();
    Some(finding(Check::Clock, Severity::Problem, saw, fix))
}

fn manifest_mismatch(
    t: Option<&TrainingStatus>,
    swarm: Option<&SwarmView>,
    now: u64,
) -> Option<Finding> {
    let peers = swarm.map(fresh).unwrap_or_default();
    let trainers = || peers.iter().filter(|p| p.heartbeat.trains && p.heartbeat.manifest.is_some());
    let (foreign, others, ours): (u64, Vec<&PeerEntry>, Option<&str>) = match t {
        Some(t) => {
            let others = trainers()
                .filter(|p| p.heartbeat.manifest.as_deref() != Some(&t.run_id))
                .copied()
                .collect();
            // Refusals count while they keep coming: a foreign peer that left is history.
            let recent =
                t.last_foreign_unix_ms.is_some_and(|at| now.saturating_sub(at) <= FRESH_MS);
            (if recent { t.foreign_messages } else { 0 }, others, Some(&t.run_id))
        }
        // A peer without a manifest sees a mismatch when trainers disagree among themselves.
        None => {
            let kinds: HashSet<&str> =
                trainers().filter_map(|p| p.heartbeat.manifest.as_deref()).collect();
            if kinds.len() < 2 {
                return None;
            }
            (0, trainers().copied().collect(), None)
        }
    };
    if foreign == 0 && others.is_empty() {
        return None;
    }
    let listed: Vec<String> = others
        .iter()
        .take(3)
        .map(|p| {
            let m = p.heartbeat.manifest.as_deref().unwrap_or("?");
            format!("{} (manifest {m})", short_peer(&p.peer))
        })
        .collect();
    let mut saw = Vec::new();
    if foreign > 0 {
        saw.push(format!("{} refused as another manifest's", count(foreign, "message")));
    }
    if !others.is_empty() {
        saw.push(format!(
            "heartbeats of another manifest from {}: {}",
            count(others.len(), "training peer"),
            listed.join(", ")
        ));
    }
    if let Some(ours) = ours {
        saw.push(format!("this peer's manifest is {ours}"));
    }
    let fix = "every peer of a run must use the same manifest: give the others this run's \
               manifest.json (--config), or give the other run another name; the log line \
               \"refusing messages of a peer with another run manifest\" names the fields that \
               differ"
        .to_owned();
    let severity = if ours.is_some() { Severity::Problem } else { Severity::Warning };
    Some(finding(Check::ManifestMismatch, severity, saw.join("; "), fix))
}

fn upload_cap(s: &StatusFile, t: &TrainingStatus, peers: Option<&[&PeerEntry]>) -> Option<Finding> {
    let cap = s.stats.max_upload_bytes_per_sec?;
    if t.period_ms == 0 || t.delta_bytes_per_period == 0 {
        return None;
    }
    let fetchers = match peers {
        Some(p) => same_run(t, p).len() as u64,
        None => s.stats.run_peers.len() as u64,
    };
    let per_period = t.delta_bytes_per_period.saturating_mul(fetchers);
    let need = per_period as f64 * 1000.0 / t.period_ms as f64;
    if fetchers == 0 || (cap as f64) >= need {
        return None;
    }
    let saw = format!(
        "upload cap {}/s ({:.3} Mbit/s); per period of {} ms this peer's deltas ({}) go to \
         {}: {} per period, {}/s — {:.1}× the cap",
        human_bytes(cap),
        cap as f64 * 8.0 / 1e6,
        t.period_ms,
        human_bytes(t.delta_bytes_per_period),
        count(fetchers, "fetcher"),
        human_bytes(per_period),
        human_bytes(need as u64),
        need / cap.max(1) as f64
    );
    let fix = format!(
        "raise --max-upload-mbps to at least {:.2} (or leave it out), or use a manifest with a \
         longer period (h × step_ms): under this cap the others fetch its deltas late and \
         merge without them",
        need * 8.0 / 1e6
    );
    Some(finding(Check::UploadCap, Severity::Problem, saw, fix))
}

/// One line for `atoll status`.
pub fn summary(findings: &[Finding]) -> String {
    let problems: Vec<&str> =
        findings.iter().filter(|f| f.severity == Severity::Problem).map(|f| f.title).collect();
    let warnings: Vec<&str> =
        findings.iter().filter(|f| f.severity == Severity::Warning).map(|f| f.title).collect();
    match (problems.is_empty(), warnings.is_empty()) {
        (true, true) => "ok".to_owned(),
        (true, false) => format!("ok, with warnings: {} (atoll doctor)", warnings.join("; ")),
        _ => format!("{} (atoll doctor explains)", problems.join("; ")),
    }
}

/// `1.5 KiB`, `3.2 MiB`, … (binary units).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `1 peer`, `2 peers`.
pub fn count(n: impl TryInto<u64>, word: &str) -> String {
    let n: u64 = n.try_into().unwrap_or(u64::MAX);
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

fn secs(ms: u64) -> String {
    if ms < 10_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{} s", ms / 1000)
    }
}

fn signed_ms(ms: i64) -> String {
    format!("{ms:+} ms")
}

#[cfg(test)]
mod tests;
