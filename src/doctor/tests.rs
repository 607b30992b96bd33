//! Each check on realistic inputs: a healthy three-peer swarm, then one thing wrong at a
//! time.

use atoll_net::{NetStats, Reachability, RelayStats};

use super::*;
use crate::heartbeat::table::{Connected, PeerEntry, SwarmView};
use crate::heartbeat::Heartbeat;
use crate::rundir::status::{StatusFile, TrainingStatus};

const NOW: u64 = 1_764_000_000_000;
const ME: &str = "12D3KooWMeMeMeMeMeMeMeMeMeMeMeMeMeMeMeMeMeMeMeMe";
const A: &str = "12D3KooWAaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "12D3KooWBbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const C: &str = "12D3KooWCccccccccccccccccccccccccccccccccccccccc";
const MANIFEST: &str = "0123456789abcdef";

/// This peer: trains the default run (5 s period, grace 1 s, 4 fragments), two run peers
/// connected, up for two minutes.
fn status() -> StatusFile {
    StatusFile {
        running: true,
        pid: 4242,
        endpoints: Default::default(),
        updated_unix_ms: NOW,
        stats: NetStats {
            peer_id: ME.into(),
            run_name: "atoll-default".into(),
            run_peers: vec![A.into(), B.into()],
            connected: 2,
            routing_table_size: 2,
            uptime_secs: 120,
            bootstrap: vec![format!("/ip4/127.0.0.1/tcp/4001/p2p/{A}")],
            ..NetStats::default()
        },
        training: Some(TrainingStatus {
            run_id: MANIFEST.into(),
            step: 200,
            round: vec![20, 20, 19, 19],
            period_ms: 5_000,
            grace_ms: 1_000,
            // 669,056 parameters at 4 bits: about 0.38 MB per period.
            delta_bytes_per_period: 376_580,
            ..TrainingStatus::default()
        }),
    }
}

fn heartbeat(rounds: &[u64]) -> Heartbeat {
    Heartbeat {
        version: "0.1.0".into(),
        trains: true,
        manifest: Some(MANIFEST.into()),
        step: 200,
        tokens_per_s: 1500.0,
        val_bpb: Some(3.3),
        rounds: rounds.to_vec(),
        anchors: Vec::new(),
        merges: 70,
        reachability: Reachability::Unknown,
        run_peers: 2,
        sent_unix_ms: NOW - 1_000,
    }
}

/// A peer heard 1 s ago, first heard 100 s ago, its clock `offset` ms ahead.
fn peer(id: &str, rounds: &[u64], offset: i64) -> PeerEntry {
    PeerEntry {
        peer: id.into(),
        received_unix_ms: NOW - 1_000,
        first_heard_unix_ms: NOW - 100_000,
        clock_offset_ms: offset,
        heartbeat: heartbeat(rounds),
    }
}

fn view(peers: Vec<PeerEntry>, connected: &[&str]) -> SwarmView {
    SwarmView {
        updated_unix_ms: NOW,
        peer_id: ME.into(),
        own: Some(heartbeat(&[20, 20, 19, 19])),
        peers,
        connected: connected
            .iter()
            .map(|p| Connected { peer: (*p).into(), since_unix_ms: NOW - 100_000 })
            .collect(),
        alone_since_unix_ms: connected.is_empty().then_some(NOW - 100_000),
        evicted: 0,
        refused: Default::default(),
    }
}

fn healthy_view() -> SwarmView {
    view(vec![peer(A, &[20, 20, 19, 19], 3), peer(B, &[20, 20, 20, 19], -2)], &[A, B])
}

fn checks(f: &[Finding]) -> Vec<Check> {
    f.iter().map(|f| f.check).collect()
}

fn only(f: Vec<Finding>, check: Check, severity: Severity) -> Finding {
    assert_eq!(checks(&f), vec![check], "{f:#?}");
    assert_eq!(f[0].severity, severity);
    f.into_iter().next().unwrap()
}

#[test]
fn a_healthy_swarm_has_no_finding() {
    let f = diagnose(&status(), Some(&healthy_view()), NOW + 300);
    assert!(f.is_empty(), "{f:#?}");
    assert!(healthy(&f));
    assert_eq!(summary(&f), "ok");
}

#[test]
fn no_reachable_peer_names_the_bootstrap_addresses() {
    let mut s = status();
    s.stats.run_peers.clear();
    s.stats.connected = 0;
    s.stats.routing_table_size = 0;
    let mut v = view(Vec::new(), &[]);
    v.alone_since_unix_ms = Some(NOW - 42_000);
    let f = only(diagnose(&s, Some(&v), NOW), Check::NoReachablePeer, Severity::Problem);
    assert!(f.saw.contains("42 s") && f.saw.contains("/ip4/127.0.0.1/tcp/4001/p2p/"), "{f:?}");
    assert!(f.fix.contains("bootstrap address"), "{f:?}");
    assert!(!healthy(std::slice::from_ref(&f)));
    assert_eq!(summary(&[f]), "no reachable peer (atoll doctor explains)");

    // Not yet: alone for less than NO_PEER_AFTER_MS (a peer just started).
    v.alone_since_unix_ms = Some(NOW - 3_000);
    assert!(diagnose(&s, Some(&v), NOW).is_empty());
    // Without a swarm table (an older peer): its uptime with no run peer counts.
    let f = only(diagnose(&s, None, NOW), Check::NoReachablePeer, Severity::Problem);
    assert!(f.saw.contains("120 s"), "{f:?}");
    // No bootstrap address at all: the fix says to give one.
    s.stats.bootstrap.clear();
    let f = only(
        diagnose(&s, Some(&view(Vec::new(), &[])), NOW),
        Check::NoReachablePeer,
        Severity::Problem,
    );
    assert!(f.saw.contains("none given") && f.fix.contains("--bootstrap"), "{f:?}");
}

#[test]
fn behind_nat_without_relay() {
    let mut s = status();
    s.stats.reachability = Reachability::Private;
    let f =
        only(diagnose(&s, Some(&healthy_view()), NOW), Check::NatWithoutRelay, Severity::Problem);
    assert!(f.fix.contains("--no-train"), "{f:?}");
    s.stats.relay = RelayStats { reservations: vec![C.into()], ..RelayStats::default() };
    assert!(diagnose(&s, Some(&healthy_view()), NOW).is_empty(), "a reservation is a way in");
    s.stats.reachability = Reachability::Public;
    s.stats.relay = RelayStats::default();
    assert!(diagnose(&s, Some(&healthy_view()), NOW).is_empty());
}

#[test]
fn islands_heard_but_not_connected_and_connected_but_silent() {
    // C is heard by heartbeat (through A or B) for 100 s, but never connected.
    let mut v = healthy_view();
    v.peers.push(peer(C, &[20, 20, 19, 19], 0));
    let f = only(diagnose(&status(), Some(&v), NOW), Check::Islands, Severity::Warning);
    assert!(f.saw.starts_with("1 peer heard by heartbeat") && f.saw.contains("…cccccccc"), "{f:?}");
    assert!(healthy(&[f]), "islands are a warning");
    // Heard for only 10 s: discovery may still connect it.
    v.peers.last_mut().unwrap().first_heard_unix_ms = NOW - 10_000;
    assert!(diagnose(&status(), Some(&v), NOW).is_empty());

    // B is connected for 100 s but its heartbeats never arrive.
    let v = view(vec![peer(A, &[20, 20, 19, 19], 0)], &[A, B]);
    let f = only(diagnose(&status(), Some(&v), NOW), Check::Islands, Severity::Warning);
    assert!(f.saw.contains("no heartbeat in 15 s") && f.saw.contains("…bbbbbbbb"), "{f:?}");
    // A heartbeat older than FRESH_MS counts as silence too.
    let mut v = healthy_view();
    v.peers[1].received_unix_ms = NOW - 40_000;
    assert_eq!(checks(&diagnose(&status(), Some(&v), NOW)), vec![Check::Islands]);
}

#[test]
fn lagging_rounds_need_two_reports_against_one_liar() {
    let mut s = status();
    s.training.as_mut().unwrap().round = vec![20, 20, 14, 19];
    let v = view(vec![peer(A, &[20, 20, 19, 19], 0), peer(B, &[20, 20, 20, 19], 0)], &[A, B]);
    let f = only(diagnose(&s, Some(&v), NOW), Check::LaggingRounds, Severity::Problem);
    assert!(f.saw.contains("fragment 2 at round 14, the swarm at 19"), "{f:?}");
    // One behind is normal (heartbeats are seconds old; merges land at different times).
    s.training.as_mut().unwrap().round = vec![19, 19, 18, 18];
    assert!(diagnose(&s, Some(&v), NOW).is_empty());
    // One liar claiming round 1000 does not make an honest peer lag.
    let liar = view(vec![peer(A, &[1000; 4], 0), peer(B, &[20, 20, 19, 19], 0)], &[A, B]);
    assert!(diagnose(&status(), Some(&liar), NOW).is_empty());
    // Peers of another manifest and relays do not count.
    let mut other = peer(A, &[90; 4], 0);
    other.heartbeat.manifest = Some("ffffffffffffffff".into());
    let mut relay = peer(B, &[90; 4], 0);
    relay.heartbeat.trains = false;
    let v = view(vec![other, relay], &[A, B]);
    assert!(!checks(&diagnose(&status(), Some(&v), NOW)).contains(&Check::LaggingRounds));
}

#[test]
fn a_clock_off_by_more_than_the_grace_window() {
    let three = |offsets: [i64; 3]| {
        let peers = [A, B, C].iter().zip(offsets).map(|(p, o)| peer(p, &[20, 20, 19, 19], o));
        view(peers.collect(), &[A, B, C])
    };
    let f = only(
        diagnose(&status(), Some(&three([5_010, 4_990, 5_003])), NOW),
        Check::Clock,
        Severity::Problem,
    );
    assert!(f.saw.contains("5.0 s ahead of this peer's") && f.saw.contains("1000 ms"), "{f:?}");
    let f = only(
        diagnose(&status(), Some(&three([-3_000, -3_100, 20])), NOW),
        Check::Clock,
        Severity::Problem,
    );
    assert!(f.saw.contains("3.0 s behind"), "{f:?}");
    // One liar (or one wrong clock elsewhere) is not our clock's fault.
    assert!(diagnose(&status(), Some(&three([60_000, 3, -2])), NOW).is_empty());
    // Within the window.
    assert!(diagnose(&status(), Some(&three([900, 950, -900])), NOW).is_empty());
    // Two peers: both must disagree with us.
    let two =
        |a, b| view(vec![peer(A, &[20, 20, 19, 19], a), peer(B, &[20, 20, 19, 19], b)], &[A, B]);
    assert!(diagnose(&status(), Some(&two(5_000, 10)), NOW).is_empty());
    assert_eq!(checks(&diagnose(&status(), Some(&two(5_000, 4_000)), NOW)), vec![Check::Clock]);
}

#[test]
fn manifest_mismatch_from_refusals_and_heartbeats() {
    let mut s = status();
    s.training.as_mut().unwrap().foreign_messages = 12;
    s.training.as_mut().unwrap().last_foreign_unix_ms = Some(NOW - 1_000);
    let f =
        only(diagnose(&s, Some(&healthy_view()), NOW), Check::ManifestMismatch, Severity::Problem);
    assert!(f.saw.contains("12 messages refused") && f.saw.contains(MANIFEST), "{f:?}");
    // A foreign peer silent for longer than FRESH_MS has left: no finding any more.
    s.training.as_mut().unwrap().last_foreign_unix_ms = Some(NOW - FRESH_MS - 1);
    assert!(diagnose(&s, Some(&healthy_view()), NOW).is_empty());

    let mut v = healthy_view();
    v.peers[0].heartbeat.manifest = Some("ffffffffffffffff".into());
    let f = only(diagnose(&status(), Some(&v), NOW), Check::ManifestMismatch, Severity::Problem);
    assert!(f.saw.contains("(manifest ffffffffffffffff)") && f.saw.contains("…aaaaaaaa"), "{f:?}");

    // A relay has no manifest of its own: trainers of two manifests are a warning there.
    let mut relay = status();
    relay.training = None;
    let f = only(diagnose(&relay, Some(&v), NOW), Check::ManifestMismatch, Severity::Warning);
    assert!(f.saw.contains("from 2 training peers"), "{f:?}");
    assert!(diagnose(&relay, Some(&healthy_view()), NOW).is_empty());
}

#[test]
fn an_upload_cap_too_low_for_the_period() {
    let mut s = status();
    // 0.01 Mbit/s against 376,580 B × 2 fetchers per 5 s = 150 KB/s.
    s.stats.max_upload_bytes_per_sec = Some(1_250);
    let f = only(diagnose(&s, Some(&healthy_view()), NOW), Check::UploadCap, Severity::Problem);
    assert!(f.saw.contains("2 fetchers") && f.saw.contains("120.5× the cap"), "{f:?}");
    assert!(f.fix.contains("at least 1.21"), "{f:?}");
    // 10 Mbit/s is plenty for this run.
    s.stats.max_upload_bytes_per_sec = Some(1_250_000);
    assert!(diagnose(&s, Some(&healthy_view()), NOW).is_empty());
    // Nobody fetches from a peer alone (that is another finding's business).
    s.stats.max_upload_bytes_per_sec = Some(1_250);
    let alone = view(Vec::new(), &[A]);
    assert!(!checks(&diagnose(&s, Some(&alone), NOW)).contains(&Check::UploadCap));
}

#[test]
fn a_stopped_or_dead_peer() {
    let mut s = status();
    s.running = false;
    let f = diagnose(&s, Some(&healthy_view()), NOW + 60_000);
    let f = only(f, Check::NotRunning, Severity::Warning);
    assert!(f.saw.contains("60 s ago"), "{f:?}");
    s.running = true;
    let f = only(
        diagnose(&s, Some(&healthy_view()), NOW + 60_000),
        Check::NotRunning,
        Severity::Problem,
    );
    assert!(f.fix.contains("pid 4242"), "{f:?}");
}

#[test]
fn problems_come_first() {
    let mut s = status();
    s.training.as_mut().unwrap().foreign_messages = 1;
    s.training.as_mut().unwrap().last_foreign_unix_ms = Some(NOW);
    let mut v = healthy_view();
    v.peers.push(peer(C, &[20, 20, 19, 19], 0));
    let f = diagnose(&s, Some(&v), NOW);
    assert_eq!(checks(&f), vec![Check::ManifestMismatch, Check::Islands]);
    assert_eq!(summary(&f), "manifest mismatch (atoll doctor explains)");
}
