//! The real thing: several `atoll run --no-train` processes on 127.0.0.1 find each other
//! through one bootstrap peer, and keep finding newcomers after that peer is killed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// How long every condition may take (the bound).
const DEADLINE: Duration = Duration::from_secs(20);
const RUN_ID: &str = "proc-test";

/// A child `atoll run` process, killed when dropped.
struct Peer {
    child: Child,
    dir: PathBuf,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Peer {
    fn spawn(root: &Path, name: &str, bootstrap: Option<&str>) -> anyhow::Result<Peer> {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir)?;
        let log = std::fs::File::create(dir.join("log.txt"))?;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_atoll"));
        cmd.args(["run", "--no-train", "--no-mdns", "--run-id", RUN_ID])
            .arg("--run-dir")
            .arg(&dir)
            .args(["--listen", "/ip4/127.0.0.1/tcp/0"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(b) = bootstrap {
            cmd.args(["--bootstrap", b]);
        }
        let child = cmd.spawn().context("cannot start atoll run")?;
        Ok(Peer { child, dir })
    }

    /// The status file, if it exists and parses yet.
    fn status(&self) -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(self.dir.join("status.json")).ok()?;
        serde_json::from_str(&text).ok()
    }

    fn peer_id(&self) -> Option<String> {
        Some(self.status()?["peer_id"].as_str()?.to_string())
    }

    fn first_addr(&self) -> Option<String> {
        Some(self.status()?["listen_addrs"][0].as_str()?.to_string())
    }

    fn run_peers(&self) -> Vec<String> {
        self.status()
            .and_then(|s| {
                s["run_peers"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            })
            .unwrap_or_default()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log.txt")).unwrap_or_default()
    }
}

/// Polls `check` until true; on timeout fails with `what` and the peers' logs.
fn wait_for(what: &str, peers: &[&Peer], mut check: impl FnMut() -> bool) -> anyhow::Result<()> {
    let start = Instant::now();
    while start.elapsed() < DEADLINE {
        if check() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let logs: Vec<String> =
        peers.iter().map(|p| format!("--- {} ---\n{}", p.dir.display(), p.log())).collect();
    bail!("timed out after {DEADLINE:?} waiting for {what}\n{}", logs.join("\n"))
}

/// True when every peer lists every other peer of `group` as a run peer.
fn all_listed(group: &[&Peer], ids: &[String]) -> bool {
    group.iter().zip(ids).all(|(p, me)| {
        let listed = p.run_peers();
        ids.iter().filter(|id| *id != me).all(|id| listed.contains(id))
    })
}

#[test]
fn five_processes_discover_each_other_and_survive_losing_the_bootstrap_peer() -> anyhow::Result<()>
{
    let root = tempfile::tempdir()?;
    let first = Peer::spawn(root.path(), "p0", None)?;
    let mut boot = None;
    wait_for("the first peer's status file", &[&first], || {
        boot = first.first_addr();
        boot.is_some()
    })?;
    let boot = boot.context("no bootstrap address")?;
    let mut peers = vec![first];
    for i in 1..5 {
        peers.push(Peer::spawn(root.path(), &format!("p{i}"), Some(&boot))?);
    }
    let refs: Vec<&Peer> = peers.iter().collect();
    let mut ids = Vec::new();
    wait_for("all five peer ids", &refs, || {
        ids = refs.iter().filter_map(|p| p.peer_id()).collect();
        ids.len() == 5
    })?;
    wait_for("every peer to list the other four", &refs, || all_listed(&refs, &ids))?;

    // Kill the bootstrap peer; a sixth joins through a survivor.
    drop(peers.remove(0));
    ids.remove(0);
    let survivor_addr = peers[1].first_addr().context("survivor has no address")?;
    peers.push(Peer::spawn(root.path(), "p5", Some(&survivor_addr))?);
    let refs: Vec<&Peer> = peers.iter().collect();
    wait_for("the sixth peer's id", &refs, || {
        if let Some(id) = refs[4].peer_id() {
            if ids.len() == 4 {
                ids.push(id);
            }
        }
        ids.len() == 5
    })?;
    wait_for("the survivors and the newcomer to list each other", &refs, || {
        all_listed(&refs, &ids)
    })?;
    Ok(())
}

#[test]
fn status_command_reads_a_stopped_peer() -> anyhow::Result<()> {
    let root = tempfile::tempdir()?;
    let mut peer = Peer::spawn(root.path(), "solo", None)?;
    wait_for("the status file", &[&peer], || peer.peer_id().is_some())?;
    // SIGTERM: the peer stops cleanly and marks its status as stopped.
    let pid = peer.child.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status()?;
    assert!(killed.success());
    let start = Instant::now();
    let code = loop {
        if let Some(code) = peer.child.try_wait()? {
            break code;
        }
        anyhow::ensure!(start.elapsed() < DEADLINE, "no exit after SIGTERM\n{}", peer.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(code.success(), "exit {code:?}\n{}", peer.log());
    let status = peer.status().context("no status after exit")?;
    assert_eq!(status["running"], serde_json::Value::Bool(false));
    let out = Command::new(env!("CARGO_BIN_EXE_atoll"))
        .args(["status", "--json", "--run-dir"])
        .arg(&peer.dir)
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let parsed: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(parsed["peer_id"], status["peer_id"]);
    let human = Command::new(env!("CARGO_BIN_EXE_atoll"))
        .args(["status", "--run-dir"])
        .arg(&peer.dir)
        .output()?;
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("stopped") && text.contains(RUN_ID), "{text}");

    // A restart in the same run dir keeps the peer id (the key file persists).
    let old_id = status["peer_id"].clone();
    drop(peer);
    let again = Peer::spawn(root.path(), "solo", None)?;
    let new_pid = serde_json::Value::from(again.child.id());
    wait_for("the restarted peer's status", &[&again], || {
        again.status().is_some_and(|s| s["pid"] == new_pid && s["running"] == true)
    })?;
    assert_eq!(again.status().context("status")?["peer_id"], old_id);
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
