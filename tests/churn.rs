//! A training swarm under churn, with real `atoll run` processes on 127.0.0.1: a peer
//! that leaves on SIGTERM, one that is killed and restarted on its run dir, and one that
//! stalls (SIGSTOP) for several rounds. The tiny model and 200 ms rounds keep each test to
//! seconds; the tests take turns (one lock) so their timings do not depend on each other.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use atoll::data::Corpus;
use atoll::manifest::Manifest;
use atoll::node::status::{self, StatusFile, TrainingStatus};
use atoll::proto::RawSettings;
use atoll::train::TrainConfig;

/// One test at a time: three or more peer processes already share the two cores.
static SERIAL: Mutex<()> = Mutex::new(());
/// How often status files are polled.
const POLL: Duration = Duration::from_millis(100);

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A fresh directory for one test's peers; kept (and printed) when `ATOLL_KEEP_DIRS` is set.
fn test_dir() -> tempfile::TempDir {
    let keep = std::env::var_os("ATOLL_KEEP_DIRS").is_some();
    let dir = tempfile::Builder::new().prefix("churn-").disable_cleanup(keep).tempdir().unwrap();
    if keep {
        eprintln!("peer dirs in {}", dir.path().display());
    }
    dir
}

/// The tiny model with rounds of 200 ms (h 10 × 20 ms), epoch now.
fn tiny_manifest(dir: &Path, name: &str) -> PathBuf {
    let corpus = Corpus::embedded().unwrap();
    let mut train = TrainConfig::tiny(7);
    train.val_every = 100;
    train.schedule.decay_steps = 2_000;
    let protocol =
        RawSettings { h: 10, step_ms: 20, grace_cap_ms: 40, ..atoll::manifest::default_protocol() };
    let mut m = Manifest::new(name, train, &corpus, protocol);
    m.epoch_unix_ms = status::unix_ms();
    let path = dir.join("manifest-in.json");
    std::fs::write(&path, m.to_bytes()).unwrap();
    path
}

/// How a peer process was started, so it can be started again on the same run dir.
#[derive(Clone)]
struct Spec {
    dir: PathBuf,
    manifest: PathBuf,
    shard: String,
    steps: u64,
    bootstrap: Option<String>,
}

/// A running `atoll run`; killed when dropped.
struct Peer {
    name: String,
    spec: Spec,
    child: Child,
    exit: Option<ExitStatus>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        if self.exit.is_none() {
            // A stopped process must be continued to die promptly on some systems.
            let _ = Command::new("kill").args(["-CONT", &self.child.id().to_string()]).status();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Peer {
    fn start(name: &str, spec: Spec) -> Peer {
        std::fs::create_dir_all(&spec.dir).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(spec.dir.join("peer.log"))
            .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_atoll"));
        cmd.arg("run")
            .arg("--run-dir")
            .arg(&spec.dir)
            .arg("--config")
            .arg(&spec.manifest)
            .args(["--shard", &spec.shard])
            .args(["--steps", &spec.steps.to_string()])
            .args(["--listen", "/ip4/127.0.0.1/tcp/0", "--no-mdns"]);
        if let Some(b) = &spec.bootstrap {
            cmd.args(["--bootstrap", b]);
        }
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("cannot start atoll run");
        Peer { name: name.to_owned(), spec, child, exit: None }
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([sig, &self.pid()]).status().unwrap();
        assert!(ok.success(), "kill {sig} {} failed", self.name);
    }

    /// The exit status once the process has ended (remembered).
    fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().unwrap();
        }
        self.exit
    }

    fn status(&self) -> Option<StatusFile> {
        status::read(&self.spec.dir.join(status::FILE_NAME)).ok()
    }

    fn training(&self) -> Option<TrainingStatus> {
        self.status().and_then(|s| s.training)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.spec.dir.join("peer.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "--- {} log tail ---\n{}",
            self.name,
            lines[lines.len().saturating_sub(20)..].join("\n")
        )
    }

    /// Fails the test (with the log) if the peer exited while it should be running.
    fn assert_alive(&mut self) {
        if let Some(exit) = self.poll_exit() {
            panic!("{} exited early ({exit})\n{}", self.name, self.log_tail());
        }
    }

    /// Polls `f` on the peer's training status until it holds, the peer exits or the
    /// deadline passes.
    fn wait_until(
        &mut self,
        what: &str,
        within: Duration,
        mut f: impl FnMut(&TrainingStatus) -> bool,
    ) -> TrainingStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(t) = self.training() {
                if f(&t) {
                    return t;
                }
            }
            self.assert_alive();
            assert!(
                Instant::now() < deadline,
                "{}: {what} not reached within {within:?}; last status {:?}\n{}",
                self.name,
                self.training(),
                self.log_tail()
            );
            std::thread::sleep(POLL);
        }
    }

    /// Waits for the process to exit.
    fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(exit) = self.poll_exit() {
                return exit;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {within:?}; last status {:?}\n{}",
                self.name,
                self.training(),
                self.log_tail()
            );
            std::thread::sleep(POLL);
        }
    }

    /// The TCP listen address with `/p2p/<id>`, once the peer listens.
    fn listen_addr(&mut self, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.status() {
                if let Some(a) = s.stats.listen_addrs.iter().find(|a| a.contains("/tcp/")) {
                    return a.clone();
                }
            }
            self.assert_alive();
            assert!(Instant::now() < deadline, "{} did not listen\n{}", self.name, self.log_tail());
            std::thread::sleep(POLL);
        }
    }
}

/// A swarm of `n` peers in `root/peer-I`, peer 0 first and the others bootstrapping from it.
fn swarm(root: &Path, name: &str, n: usize, steps: &[u64]) -> Vec<Peer> {
    let manifest = tiny_manifest(root, name);
    let spec = |i: usize, bootstrap: Option<String>| Spec {
        dir: root.join(format!("peer-{i}")),
        manifest: manifest.clone(),
        shard: format!("{i}/{n}"),
        steps: steps[i],
        bootstrap,
    };
    let mut peers = vec![Peer::start("peer 0", spec(0, None))];
    let addr = peers[0].listen_addr(Duration::from_secs(30));
    for i in 1..n {
        peers.push(Peer::start(&format!("peer {i}"), spec(i, Some(addr.clone()))));
    }
    peers
}

/// Waits for every peer to finish on its own and checks that all exited 0.
fn wait_all_exit(peers: &mut [Peer], within: Duration) {
    let deadline = Instant::now() + within;
    for p in peers.iter_mut() {
        let left = deadline.saturating_duration_since(Instant::now());
        let exit = p.wait_exit(left);
        assert!(exit.success(), "{} exited with {exit}\n{}", p.name, p.log_tail());
    }
}

/// Final status of every peer: stopped, trained to its target, all with the same anchors.
fn assert_same_final_anchors(peers: &[Peer]) {
    let finals: Vec<TrainingStatus> = peers
        .iter()
        .map(|p| {
            let s = p.status().unwrap_or_else(|| panic!("{} left no status", p.name));
            assert!(!s.running, "{} says it is running after exiting", p.name);
            s.training.unwrap()
        })
        .collect();
    for (p, t) in peers.iter().zip(&finals) {
        assert_eq!(t.step, p.spec.steps, "{} ended at step {}", p.name, t.step);
        assert!(t.final_val_bpb.is_some(), "{} has no final evaluation", p.name);
        assert_eq!(t.anchor_hashes.len(), 4, "{}", p.name);
    }
    for (p, t) in peers.iter().zip(&finals).skip(1) {
        assert_eq!(
            t.anchor_hashes,
            finals[0].anchor_hashes,
            "{} ended with other anchors than peer 0 (rounds {:?} vs {:?})\n{}\n{}",
            p.name,
            t.round,
            finals[0].round,
            p.log_tail(),
            peers[0].log_tail()
        );
    }
}

#[test]
fn sigterm_leaves_at_a_step_boundary_with_a_checkpoint_and_the_swarm_goes_on() {
    let _serial = serial();
    let tmp = test_dir();
    let mut peers = swarm(tmp.path(), "churn-leave", 2, &[100_000, 100_000]);
    peers[1].wait_until("step 100", Duration::from_secs(60), |t| t.step >= 100);
    peers[0].wait_until("a merge", Duration::from_secs(20), |t| t.merges >= 1);

    peers[1].signal("-TERM");
    let exit = peers[1].wait_exit(Duration::from_secs(10));
    assert!(exit.success(), "peer 1 exited with {exit} on SIGTERM\n{}", peers[1].log_tail());
    let left = peers[1].status().expect("peer 1 left no status.json");
    assert!(!left.running, "peer 1 still says running=true after exiting");
    let left_step = left.training.as_ref().unwrap().step;
    assert!(left_step >= 100, "peer 1 status step {left_step}");
    let ckpt = atoll::checkpoint::load(&atoll::checkpoint::path_in(&peers[1].spec.dir))
        .expect("peer 1's checkpoint does not load");
    assert!(ckpt.meta.state.step >= 100, "checkpoint at step {}", ckpt.meta.state.step);
    assert_eq!(
        ckpt.meta.state.step, left_step,
        "the checkpoint is not of the step the peer left at"
    );

    // Peer 0 goes on training (and keeps its round clock) alone.
    let before = peers[0].training().unwrap();
    let max_round = |t: &TrainingStatus| t.round.iter().copied().max().unwrap_or(0);
    peers[0].wait_until("training and merging alone", Duration::from_secs(20), |t| {
        t.step >= before.step + 100
            && max_round(t) >= max_round(&before) + 5
            && t.merges >= before.merges + 4
    });
    peers[0].assert_alive();
}

#[test]
fn a_killed_peer_restarts_from_its_run_dir_and_the_swarm_ends_in_agreement() {
    let _serial = serial();
    let tmp = test_dir();
    let steps = 3_000;
    let mut peers = swarm(tmp.path(), "churn-crash", 3, &[steps, steps, steps]);
    let before =
        peers[2].wait_until("2 merges", Duration::from_secs(60), |t| t.merges >= 2 && t.step >= 60);
    let id_before = peers[2].status().unwrap().stats.peer_id;

    peers[2].child.kill().unwrap();
    peers[2].exit = Some(peers[2].child.wait().unwrap());
    let ckpt = atoll::checkpoint::load(&atoll::checkpoint::path_in(&peers[2].spec.dir))
        .expect("the killed peer's checkpoint does not load");
    let ckpt_step = ckpt.meta.state.step;
    assert!(ckpt_step > 0, "no checkpoint step");
    assert!(ckpt_step <= before.step + 50, "checkpoint {ckpt_step} after {} steps", before.step);
    // The status file of the killed process (still running=true) must not be mistaken for
    // the restarted one's.
    std::fs::remove_file(peers[2].spec.dir.join(status::FILE_NAME)).unwrap();

    let spec = peers[2].spec.clone();
    peers[2] = Peer::start("peer 2 (restarted)", spec);
    let first = peers[2].wait_until("a status", Duration::from_secs(30), |_| true);
    assert!(
        first.step >= ckpt_step,
        "the restarted peer reports step {} before its checkpoint's {ckpt_step}",
        first.step
    );
    let again = peers[2].status().unwrap();
    assert_eq!(again.stats.peer_id, id_before, "the restarted peer has another peer id");
    // It contributes again: merges after the restart (the counter starts over).
    let t = peers[2].wait_until("2 merges after restart", Duration::from_secs(30), |t| {
        t.merges >= 2 && t.step > ckpt_step
    });
    assert!(t.step > ckpt_step);
    for p in &mut peers[..2] {
        p.assert_alive();
    }

    wait_all_exit(&mut peers, Duration::from_secs(90));
    assert_same_final_anchors(&peers);
}

#[test]
fn a_stalled_peer_does_not_stop_the_others_and_catches_up() {
    let _serial = serial();
    let tmp = test_dir();
    // About 600 steps/s per peer on 2 cores: peers 0 and 1 still train while 2 stalls.
    let steps = 4_000;
    let mut peers = swarm(tmp.path(), "churn-straggler", 3, &[steps, steps, steps]);
    peers[2].wait_until("2 merges", Duration::from_secs(60), |t| t.merges >= 2);
    for p in &mut peers[..2] {
        p.wait_until("2 merges", Duration::from_secs(20), |t| t.merges >= 2);
    }

    peers[2].signal("-STOP");
    let stopped = Instant::now();
    // The least advanced fragment's round.
    let rounds = |p: &Peer| p.training().map(|t| t.round.iter().copied().min().unwrap_or(0));
    let r0: Vec<u64> = peers[..2].iter().map(|p| rounds(p).unwrap()).collect();
    let m0: Vec<u64> = peers[..2].iter().map(|p| p.training().unwrap().merges).collect();
    let stalled = peers[2].training().unwrap();
    // Two seconds stopped: ten periods of 200 ms.
    while stopped.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(POLL);
    }
    // Status files are rewritten every 500 ms.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let r1: Vec<u64> = peers[..2].iter().map(|p| rounds(p).unwrap()).collect();
        if r1.iter().zip(&r0).all(|(a, b)| a >= &(b + 3)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rounds {r0:?} → {r1:?} while peer 2 was stopped; statuses {:?} {:?}\n{}\n{}",
            peers[0].training(),
            peers[1].training(),
            peers[0].log_tail(),
            peers[1].log_tail()
        );
        std::thread::sleep(POLL);
    }
    for (i, p) in peers[..2].iter_mut().enumerate() {
        p.assert_alive();
        let m = p.training().unwrap().merges;
        assert!(m >= m0[i] + 3, "peer {i} merged {} → {m} while peer 2 was stopped", m0[i]);
    }
    assert_eq!(peers[2].training().unwrap().step, stalled.step, "peer 2 was not stopped");
    for p in &peers[..2] {
        let t = p.training().unwrap();
        assert!(!t.trained, "{} finished training during the stall; give more steps", p.name);
    }
    peers[2].signal("-CONT");
    peers[2].wait_until("training again", Duration::from_secs(10), |t| t.step > stalled.step);

    wait_all_exit(&mut peers, Duration::from_secs(90));
    assert_same_final_anchors(&peers);
}
