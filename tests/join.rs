//! Joining in one line: a peer given only `RUN_ID@MULTIADDR` fetches the run's manifest
//! from the swarm, trains and agrees; a wrong run id is refused naming both ids; an
//! unreachable address is reported with each address tried and why it failed.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use atoll::fleet::Process;
use atoll::manifest::Manifest;
use common::{Peer, Spec, Until};

const DEADLINE: Duration = Duration::from_secs(30);

/// The `RUN_ID@MULTIADDR` of the `others join with: …` line a peer printed.
fn join_target(peer: &mut Peer) -> String {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let log = peer.log();
        let line = log.lines().find_map(|l| l.strip_prefix("others join with: "));
        if let Some(target) = line.and_then(|l| l.split_once("--join ")).map(|(_, t)| t.trim()) {
            return target.to_owned();
        }
        peer.assert_alive();
        assert!(Instant::now() < deadline, "no join line printed\n{}", peer.log_tail());
        std::thread::sleep(common::POLL);
    }
}

/// Runs `atoll ARGS` to its end (within `within`); returns its exit status and output.
fn run_to_end(dir: &Path, args: &[String], within: Duration) -> (std::process::ExitStatus, String) {
    std::fs::create_dir_all(dir).unwrap();
    let args: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
    let log = dir.join("out.log");
    let mut p = Process::start(Path::new(env!("CARGO_BIN_EXE_atoll")), &args, &[], &log).unwrap();
    let deadline = Instant::now() + within;
    loop {
        if let Some(exit) = p.poll_exit().unwrap() {
            return (exit, p.log());
        }
        assert!(Instant::now() < deadline, "atoll did not exit within {within:?}\n{}", p.log());
        std::thread::sleep(common::POLL);
    }
}

#[test]
fn a_peer_given_only_the_join_line_joins_trains_and_agrees() {
    let _serial = common::serial();
    let tmp = common::test_dir("join-");
    // The swarm trains on past its three rounds, the joiner's start and its three merges.
    let steps = common::steps_for(Duration::from_secs(15));
    let mut peers = common::swarm(tmp.path(), "join-test", &[steps, steps]);
    for p in &mut peers {
        p.wait_until("3 rounds merged", DEADLINE, |t| t.merges >= 3);
    }
    let target = join_target(&mut peers[1]);
    let dir = tmp.path().join("peer-joined");
    let mut joined = Peer::start("joiner", Spec::join(dir.clone(), &target, Until::Steps(300)));
    let t = joined.wait_until("training and merging", Duration::from_secs(45), |t| {
        t.step >= 100 && t.merges >= 3
    });
    // The manifest it fetched is the swarm's, byte for byte.
    let given = std::fs::read(tmp.path().join("manifest-in.json")).unwrap();
    let saved = std::fs::read(dir.join(atoll::manifest::FILE_NAME)).unwrap();
    assert_eq!(Manifest::from_bytes(&saved).unwrap(), Manifest::from_bytes(&given).unwrap());
    assert_eq!(t.run_id, Manifest::from_bytes(&given).unwrap().run_id().short());
    peers.push(joined);
    let deadline = common::deadline_for(steps, peers.len());
    common::wait_all_exit(&mut peers, deadline);
    common::assert_same_final_anchors(&peers);
}

#[test]
fn a_wrong_run_id_is_refused_naming_both_ids() {
    let _serial = common::serial();
    let tmp = common::test_dir("join-wrong-");
    let manifest_path = common::swarm_manifest(tmp.path(), "join-wrong");
    let manifest = Manifest::load(&manifest_path).unwrap();
    // A bootstrap peer that serves the run's manifest (`--no-train --config`).
    let spec = Spec::serve(tmp.path().join("boot"), "join-wrong")
        .arg("--config")
        .arg(manifest_path.to_str().unwrap());
    let mut boot = Peer::start("bootstrap", spec);
    let target = join_target(&mut boot);
    let (id, addr) = target.split_once('@').unwrap();
    assert_eq!(id, manifest.run_id().hex());

    let mut other = manifest.clone();
    other.train.seed += 1;
    let wrong = other.run_id().hex();
    let dir = tmp.path().join("wrong");
    let args: Vec<String> = ["run", "--run-dir", dir.to_str().unwrap(), "--no-mdns"]
        .into_iter()
        .map(String::from)
        .chain(["--join".into(), format!("{wrong}@{addr}"), "--steps".into(), "10".into()])
        .collect();
    let (exit, out) = run_to_end(&dir, &args, DEADLINE);
    assert!(!exit.success(), "a wrong run id was accepted\n{out}");
    assert!(out.contains(&wrong) && out.contains(id), "the error must name both ids\n{out}");
    assert!(out.contains("wrong run id"), "{out}");
    assert!(!dir.join(atoll::manifest::FILE_NAME).exists(), "a refused manifest was saved");

    // The right id through the same bootstrap peer: the manifest is fetched and saved.
    let dir = tmp.path().join("right");
    let spec = Spec::join(dir.clone(), &target, Until::Steps(10_000));
    let mut right = Peer::start("right", spec);
    let path = dir.join(atoll::manifest::FILE_NAME);
    let deadline = Instant::now() + DEADLINE;
    while !path.exists() {
        right.assert_alive();
        assert!(Instant::now() < deadline, "no manifest saved\n{}", right.log_tail());
        std::thread::sleep(common::POLL);
    }
    assert_eq!(Manifest::load(&path).unwrap(), manifest);
    boot.assert_alive();
}

#[test]
fn an_unreachable_address_is_reported_with_every_address_tried_and_why() {
    let _serial = common::serial();
    let tmp = common::test_dir("join-unreachable-");
    // Two ports with nothing listening (bound, then released).
    let closed = || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let peer = || atoll_net::PeerId::from(atoll_net::Keypair::generate_ed25519().public());
    let a = format!("/ip4/127.0.0.1/tcp/{}/p2p/{}", closed(), peer());
    let b = format!("/ip4/127.0.0.1/tcp/{}/p2p/{}", closed(), peer());
    let id = "ab".repeat(32);
    let dir = tmp.path().join("joiner");
    let args: Vec<String> = ["run", "--run-dir", dir.to_str().unwrap(), "--no-mdns"]
        .into_iter()
        .map(String::from)
        .chain(["--join".into(), format!("{id}@{a}"), "--bootstrap".into(), b.clone()])
        .collect();
    let started = Instant::now();
    let (exit, out) = run_to_end(&dir, &args, Duration::from_secs(45));
    assert!(!exit.success(), "joined nobody, yet succeeded\n{out}");
    for addr in [&a, &b] {
        let line = out.lines().find(|l| l.contains(addr.as_str()) && l.contains("unreachable"));
        let line = line.unwrap_or_else(|| panic!("{addr} not reported as tried\n{out}"));
        assert!(line.to_lowercase().contains("refused"), "no reason given: {line}");
    }
    // Refused connections fail at once: no waiting for the join timeout.
    assert!(started.elapsed() < atoll::join::JOIN_TIMEOUT, "took {:?}", started.elapsed());
}
