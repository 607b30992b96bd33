//! Heartbeats between real peers on 127.0.0.1: `atoll status --swarm` on one peer lists the
//! whole run with live numbers, a `--no-train` peer sees every trainer too, and `atoll
//! doctor` finds a clock that disagrees with the swarm's. Peer 2's clock is shifted 5 s ahead for its heartbeats only (test hook
//! `ATOLL_TEST_HEARTBEAT_SKEW_MS`; the rounds keep the real clock): peer 2 sees the swarm
//! 5 s behind it and says so, while peers 0 and 1 see one odd peer among two and do not
//! blame their own clocks.

mod common;

use std::time::Duration;

use atoll::heartbeat::short_peer;
use atoll::node::heartbeats::SKEW_ENV;
use atoll::rundir::status;
use atoll::train::TrainConfig;
use common::{atoll, swarm_view, wait_for, write_manifest, Peer, Spec, Until};

const DEADLINE: Duration = Duration::from_secs(45);

#[test]
fn status_swarm_lists_every_peer_and_doctor_finds_a_skewed_clock() {
    let _serial = common::serial();
    let tmp = common::test_dir("swarm-view-");
    // Rounds of 1 s and a grace window of 250 ms: the tiny runs' 40 ms window would be
    // within reach of gossip delays on a loaded two-core machine.
    let mut train = TrainConfig::tiny(3);
    train.val_every = 20;
    let mut m = common::tiny_manifest("swarm-view", train);
    m.protocol.step_ms = 100;
    m.protocol.grace_cap_ms = 250;
    m.epoch_unix_ms = status::unix_ms();
    let manifest = write_manifest(tmp.path().join("manifest.json"), &m);
    let spec = |i: usize| {
        let dir = tmp.path().join(format!("peer-{i}"));
        Spec::train(dir, &manifest, &format!("{i}/3"), Until::Seconds(120))
    };
    let mut peers = vec![Peer::start("peer 0", spec(0))];
    let addr = peers[0].listen_addr(DEADLINE);
    peers.push(Peer::start("peer 1", spec(1).bootstrap(Some(addr.clone()))));
    let skew = format!("{SKEW_ENV}=5000");
    let skewed = spec(2).bootstrap(Some(addr.clone())).wrapper(&["env", &skew]);
    peers.push(Peer::start("peer 2", skewed));
    let relay = Spec::serve(tmp.path().join("relay"), "swarm-view");
    let relay_dir = relay.dir.display().to_string();
    peers.push(Peer::start("relay", relay.bootstrap(Some(addr))));

    // Every peer hears the three others, and every trainer's steps.
    let trainers_heard = |dir: &std::path::Path, want: usize| {
        swarm_view(dir).is_some_and(|v| {
            let trainers: Vec<_> = v.peers.iter().filter(|e| e.heartbeat.trains).collect();
            v.peers.len() == 3
                && trainers.len() == want
                && trainers.iter().all(|e| e.heartbeat.step > 0)
        })
    };
    wait_for("every peer to hear the others", DEADLINE, &mut peers, |p| {
        p[..3].iter().all(|peer| trainers_heard(&peer.spec.dir, 2))
            && trainers_heard(&p[3].spec.dir, 3)
    });
    let dirs: Vec<String> = peers.iter().map(|p| p.spec.dir.display().to_string()).collect();
    let ids: Vec<String> = peers.iter().map(|p| p.peer_id().unwrap()).collect();
    let dirs = &dirs[..3];

    for dir in [&dirs[0], &relay_dir] {
        let (code, out) = atoll(&["status", "--swarm", "--run-dir", dir]);
        assert_eq!(code, 0, "{out}");
        for id in &ids {
            assert!(out.contains(&short_peer(id)), "status --swarm misses {id}:\n{out}");
        }
        assert!(out.starts_with("4 peers known to") && out.contains("no-train"), "{out}");
    }
    let (code, json) = atoll(&["status", "--swarm", "--json", "--run-dir", &dirs[0]]);
    assert_eq!(code, 0);
    let view: atoll::heartbeat::table::SwarmView = serde_json::from_str(&json).unwrap();
    let own = view.own.as_ref().expect("no own heartbeat");
    assert!(own.trains && own.step > 0 && own.version == env!("CARGO_PKG_VERSION"));
    let relay_row = view.peers.iter().find(|p| p.peer == ids[3]).unwrap();
    assert!(!relay_row.heartbeat.trains && relay_row.heartbeat.manifest.is_none());
    let skewed = view.peers.iter().find(|p| p.peer == ids[2]).unwrap();
    assert!((4_000..6_000).contains(&skewed.clock_offset_ms), "{skewed:?}");
    let honest = view.peers.iter().find(|p| p.peer == ids[1]).unwrap();
    eprintln!("honest peer's clock offset as peer 0 sees it: {} ms", honest.clock_offset_ms);

    // Peer 2's clock disagrees with the swarm's.
    let (code, out) = atoll(&["doctor", "--run-dir", &dirs[2]]);
    assert_eq!(code, 1, "doctor found no problem on the skewed peer:\n{out}");
    assert!(out.contains("clock disagrees with the swarm") && out.contains("behind"), "{out}");
    // Peers 0 and 1 hear one odd clock among two: not theirs to fix.
    for dir in &dirs[..2] {
        let (_, out) = atoll(&["doctor", "--json", "--run-dir", dir]);
        let report: serde_json::Value = serde_json::from_str(&out).unwrap();
        let checks: Vec<&str> = report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f["check"].as_str())
            .collect();
        assert!(!checks.contains(&"clock"), "{dir}: {out}");
        eprintln!("doctor on {dir}: {checks:?}");
    }
    let (_, out) = atoll(&["status", "--run-dir", &dirs[2]]);
    assert!(out.contains("health   clock disagrees with the swarm"), "{out}");
}
