//! `atoll doctor` on real peers whose trouble is created for real: a bootstrap address
//! nobody listens on, a peer of another manifest under the same run name, an upload cap far
//! below what one round period needs.

mod common;

use std::time::Duration;

use atoll::train::TrainConfig;
use common::{atoll, swarm_view, tiny_manifest, wait_for, write_manifest, Peer, Spec, Until};

const DEADLINE: Duration = Duration::from_secs(40);

/// The checks `atoll doctor --json` reported, and its exit code.
fn doctor(peer: &Peer) -> (i32, Vec<String>, String) {
    let dir = peer.spec.dir.display().to_string();
    let (code, out) = atoll(&["doctor", "--json", "--run-dir", &dir]);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let checks = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["check"].as_str().map(str::to_owned))
        .collect();
    (code, checks, out)
}

#[test]
fn a_dead_bootstrap_address_is_no_reachable_peer() {
    let _serial = common::serial();
    let tmp = common::test_dir("doctor-dead-");
    let manifest = common::swarm_manifest(tmp.path(), "doctor-dead");
    // A port nobody listens on, and a peer id nobody has.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let ghost = atoll_net::Keypair::generate_ed25519().public().to_peer_id();
    let dead = format!("/ip4/127.0.0.1/tcp/{port}/p2p/{ghost}");
    let spec = Spec::train(tmp.path().join("alone"), &manifest, "0/1", Until::Seconds(60));
    let mut peer = Peer::start("alone", spec.bootstrap(Some(dead.clone())));
    let dir = peer.spec.dir.display().to_string();
    wait_for("a swarm table alone for 10 s", DEADLINE, std::slice::from_mut(&mut peer), |p| {
        swarm_view(&p[0].spec.dir).is_some_and(|v| {
            v.alone_since_unix_ms.is_some_and(|t| {
                v.updated_unix_ms.saturating_sub(t) >= atoll::doctor::NO_PEER_AFTER_MS
            })
        })
    });
    let (code, checks, out) = doctor(&peer);
    assert_eq!(code, 1, "{out}");
    assert_eq!(checks, vec!["no_reachable_peer"], "{out}");
    assert!(out.contains(&dead), "the finding does not name the bootstrap address:\n{out}");
    let (code, human) = atoll(&["doctor", "--run-dir", &dir]);
    assert_eq!(code, 1);
    assert!(human.contains("PROBLEM  no reachable peer"), "{human}");
    let (_, status) = atoll(&["status", "--run-dir", &dir]);
    assert!(status.contains("health   no reachable peer"), "{status}");
}

#[test]
fn another_manifest_and_a_cap_far_too_low_are_found() {
    let _serial = common::serial();
    let tmp = common::test_dir("doctor-mismatch-");
    let manifest = common::swarm_manifest(tmp.path(), "doctor-mismatch");
    let mut other = tiny_manifest("doctor-mismatch", TrainConfig::tiny(9));
    other.train.batch = 6;
    let other = write_manifest(tmp.path().join("other.json"), &other);
    let spec = |name: &str, manifest, shard: &str| {
        Spec::train(tmp.path().join(name), manifest, shard, Until::Seconds(90))
    };
    // The capped peer: 0.01 Mbit/s, about 1.2 KiB/s, for deltas of ~15 KiB per 200 ms.
    let capped = spec("capped", &manifest, "0/2").arg("--max-upload-mbps").arg("0.01");
    let mut peers = vec![Peer::start("capped", capped)];
    let addr = peers[0].listen_addr(DEADLINE);
    peers.push(Peer::start(
        "fetcher",
        spec("fetcher", &manifest, "1/2").bootstrap(Some(addr.clone())),
    ));
    peers.push(Peer::start("foreign", spec("foreign", &other, "0/1").bootstrap(Some(addr))));

    wait_for(
        "the capped peer to hear both and refuse the foreign one",
        DEADLINE,
        &mut peers,
        |p| {
            let refused = p[0].training().is_some_and(|t| t.foreign_messages > 0);
            let heard = swarm_view(&p[0].spec.dir).is_some_and(|v| v.peers.len() == 2);
            refused && heard
        },
    );
    let (code, checks, out) = doctor(&peers[0]);
    assert_eq!(code, 1, "{out}");
    for want in ["manifest_mismatch", "upload_cap"] {
        assert!(checks.iter().any(|c| c == want), "{want} not found:\n{out}");
    }
    wait_for("the fetcher to refuse the foreign peer", DEADLINE, &mut peers, |p| {
        p[1].training().is_some_and(|t| t.foreign_messages > 0)
    });
    let (code, checks, out) = doctor(&peers[1]);
    assert_eq!(code, 1, "{out}");
    assert!(checks.iter().any(|c| c == "manifest_mismatch"), "{out}");
    assert!(!checks.iter().any(|c| c == "upload_cap"), "the fetcher has no cap:\n{out}");
}

/// Islands, for real: relay A refuses relay C (fault injection) while B connects both, so
/// A hears C's heartbeats through B but never connects to it. After
/// [`atoll::doctor::ISLAND_AFTER_MS`] A's doctor warns (exit 0: a warning, not a problem).
#[test]
fn a_peer_heard_through_others_but_never_connected_is_an_island_warning() {
    let _serial = common::serial();
    let tmp = common::test_dir("doctor-islands-");
    let serve = |name: &str| Spec::serve(tmp.path().join(name), "doctor-islands");
    let mut peers = vec![Peer::start("a", serve("a").arg("--fault-injection"))];
    let addr_a = peers[0].listen_addr(DEADLINE);
    peers.push(Peer::start("b", serve("b").bootstrap(Some(addr_a))));
    let addr_b = peers[1].listen_addr(DEADLINE);
    peers.push(Peer::start("c", serve("c").bootstrap(Some(addr_b))));
    wait_for("c's peer id", DEADLINE, &mut peers, |p| p[2].peer_id().is_some());
    let c = peers[2].peer_id().unwrap();
    let blocked = peers[0].spec.dir.join(atoll_net::fault::FILE_NAME);
    std::fs::write(&blocked, format!("{c}\n")).unwrap();

    // A hears C (through B) and is not connected to it, for ISLAND_AFTER_MS.
    let within = DEADLINE + Duration::from_millis(atoll::doctor::ISLAND_AFTER_MS);
    wait_for("a to hear c through b for a while", within, &mut peers, |p| {
        swarm_view(&p[0].spec.dir).is_some_and(|v| {
            let at = v.updated_unix_ms;
            let heard = v.peers.iter().find(|e| e.peer == c);
            let connected = v.connected.iter().any(|e| e.peer == c);
            heard.is_some_and(|e| {
                at.saturating_sub(e.received_unix_ms) <= atoll::doctor::FRESH_MS
                    && at.saturating_sub(e.first_heard_unix_ms) >= atoll::doctor::ISLAND_AFTER_MS
            }) && !connected
        })
    });
    let (code, checks, out) = doctor(&peers[0]);
    assert_eq!(code, 0, "islands are a warning:\n{out}");
    assert_eq!(checks, vec!["islands"], "{out}");
    assert!(out.contains(&atoll::heartbeat::short_peer(&c)), "{out}");
    // B sees no island: it is connected to both.
    let (code, checks, out) = doctor(&peers[1]);
    assert_eq!((code, checks.len()), (0, 0), "{out}");
}
