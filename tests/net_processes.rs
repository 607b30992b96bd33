//! The real thing: several `atoll run --no-train` processes on 127.0.0.1 find each other
//! through one bootstrap peer, and keep finding newcomers after that peer is killed.

mod common;

use std::process::Command;
use std::time::Duration;

use anyhow::Context;

use common::{wait_for, Peer, Spec};

/// How long every condition may take (the bound).
const DEADLINE: Duration = Duration::from_secs(20);
const RUN_NAME: &str = "proc-test";

fn spawn(root: &std::path::Path, name: &str, bootstrap: Option<String>) -> Peer {
    Peer::start(name, Spec::serve(root.join(name), RUN_NAME).bootstrap(bootstrap))
}

/// True when every peer lists every other peer of `group` as a run peer.
fn all_listed(group: &[Peer], ids: &[String]) -> bool {
    group.iter().zip(ids).all(|(p, me)| {
        let listed = p.run_peers();
        ids.iter().filter(|id| *id != me).all(|id| listed.contains(id))
    })
}

/// The peer ids of `peers`, once every status file names one.
fn peer_ids(peers: &mut [Peer]) -> Vec<String> {
    let mut ids = Vec::new();
    wait_for("every peer id", DEADLINE, peers, |ps| {
        ids = ps.iter().filter_map(Peer::peer_id).collect();
        ids.len() == ps.len()
    });
    ids
}

#[test]
fn five_processes_discover_each_other_and_survive_losing_the_bootstrap_peer() {
    let root = common::test_dir("net-proc-");
    let mut first = spawn(root.path(), "p0", None);
    let boot = first.listen_addr(DEADLINE);
    let mut peers = vec![first];
    for i in 1..5 {
        peers.push(spawn(root.path(), &format!("p{i}"), Some(boot.clone())));
    }
    let ids = peer_ids(&mut peers);
    wait_for("every peer to list the other four", DEADLINE, &mut peers, |p| all_listed(p, &ids));

    // Kill the bootstrap peer; a sixth joins through a survivor.
    drop(peers.remove(0));
    let survivor_addr = peers[1].listen_addr(DEADLINE);
    peers.push(spawn(root.path(), "p5", Some(survivor_addr)));
    let ids = peer_ids(&mut peers);
    wait_for("the survivors and the newcomer to list each other", DEADLINE, &mut peers, |p| {
        all_listed(p, &ids)
    });
}

#[test]
fn status_command_reads_a_stopped_peer() -> anyhow::Result<()> {
    let root = common::test_dir("net-proc-");
    let mut peer = spawn(root.path(), "solo", None);
    let old_id = peer_ids(std::slice::from_mut(&mut peer)).remove(0);
    // SIGTERM: the peer stops cleanly and marks its status as stopped.
    peer.signal("-TERM");
    let code = peer.wait_exit(DEADLINE);
    assert!(code.success(), "exit {code:?}\n{}", peer.log_tail());
    let status = peer.status().context("no status after exit")?;
    assert!(!status.running);
    let out = Command::new(env!("CARGO_BIN_EXE_atoll"))
        .args(["status", "--json", "--run-dir"])
        .arg(&peer.spec.dir)
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let parsed: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(parsed["peer_id"], status.stats.peer_id);
    let human = Command::new(env!("CARGO_BIN_EXE_atoll"))
        .args(["status", "--run-dir"])
        .arg(&peer.spec.dir)
        .output()?;
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("stopped") && text.contains(RUN_NAME), "{text}");

    // A restart in the same run dir keeps the peer id (the key file persists).
    drop(peer);
    let mut again = [spawn(root.path(), "solo", None)];
    let new_pid = again[0].process.pid();
    wait_for("the restarted peer's status", DEADLINE, &mut again, |p| {
        p[0].status().is_some_and(|s| s.pid == new_pid && s.running)
    });
    assert_eq!(again[0].peer_id().context("status")?, old_id);
    Ok(())
}

#[test]
fn a_peer_without_training_serves_for_its_duration_then_stops() -> anyhow::Result<()> {
    let root = common::test_dir("net-proc-");
    let spec = Spec::serve(root.path().join("timed"), RUN_NAME).arg("--duration").arg("2");
    let mut peer = Peer::start("timed", spec);
    let code = peer.wait_exit(DEADLINE);
    assert!(code.success(), "exit {code:?}\n{}", peer.log_tail());
    assert!(!peer.status().context("no status after exit")?.running);
    // --steps counts inner steps: a peer that does not train refuses it.
    let out = Command::new(env!("CARGO_BIN_EXE_atoll"))
        .args(["run", "--no-train", "--steps", "10", "--no-mdns"])
        .arg("--run-dir")
        .arg(root.path().join("steps"))
        .output()?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--steps") && err.contains("--no-train"), "{err}");
    Ok(())
}

#[test]
fn corrupt_key_file_is_a_clear_error() -> anyhow::Result<()> {
    let root = tempfile::tempdir()?;
    std::fs::write(root.path().join("peer_key"), b"garbage")?;
    let out = Command::new(env!("CARGO_BIN_EXE_atoll"))
        .args(["run", "--no-train", "--no-mdns", "--listen", "/ip4/127.0.0.1/tcp/0"])
        .arg("--run-dir")
        .arg(root.path())
        .output()?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("corrupt") && err.contains("peer_key"), "{err}");
    Ok(())
}
