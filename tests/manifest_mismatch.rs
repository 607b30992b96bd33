//! Two real peers under one swarm name whose manifests differ: each refuses the other's
//! messages, counts them, and logs which manifest fields differ.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use atoll::data::Corpus;
use atoll::manifest::Manifest;
use atoll::proto::RawSettings;
use atoll::train::TrainConfig;

const DEADLINE: Duration = Duration::from_secs(40);

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
    fn spawn(root: &Path, name: &str, manifest: &Path, bootstrap: Option<&str>) -> Peer {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(dir.join("peer.log")).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_atoll"));
        cmd.arg("run")
            .arg("--run-dir")
            .arg(&dir)
            .arg("--config")
            .arg(manifest)
            .args(["--shard", "0/1", "--duration", "60", "--no-mdns"])
            .args(["--listen", "/ip4/127.0.0.1/tcp/0"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if let Some(b) = bootstrap {
            cmd.args(["--bootstrap", b]);
        }
        Peer { child: cmd.spawn().unwrap(), dir }
    }

    fn status(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&std::fs::read(self.dir.join("status.json")).ok()?).ok()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("peer.log")).unwrap_or_default()
    }
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn peers_with_different_manifests_refuse_each_other_and_say_why() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = Corpus::embedded().unwrap();
    let protocol =
        RawSettings { h: 10, step_ms: 20, grace_cap_ms: 40, ..atoll::manifest::default_protocol() };
    let a = Manifest::new("mismatch-test", TrainConfig::tiny(1), &corpus, protocol);
    let mut b = a.clone();
    b.train.batch = 6;
    let (pa, pb) = (tmp.path().join("a.json"), tmp.path().join("b.json"));
    std::fs::write(&pa, a.to_bytes()).unwrap();
    std::fs::write(&pb, b.to_bytes()).unwrap();

    let first = Peer::spawn(tmp.path(), "a", &pa, None);
    let addr = wait_for("peer a's address", || {
        Some(first.status()?["listen_addrs"][0].as_str()?.to_string())
    });
    let second = Peer::spawn(tmp.path(), "b", &pb, Some(&addr));
    for peer in [&first, &second] {
        wait_for("refused foreign messages", || {
            let n = peer.status()?["training"]["foreign_messages"].as_u64()?;
            (n > 0).then_some(())
        });
        wait_for("a log line naming the differing field", || {
            peer.log().contains("train.batch").then_some(())
        });
    }
    // Refusing is not failing: both are still training.
    for peer in [&first, &second] {
        let s = peer.status().unwrap();
        assert_eq!(s["running"], true, "{s:#}");
    }
}
