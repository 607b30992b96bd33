//! Helpers of the multi-process tests: real `atoll run` processes on 127.0.0.1, each in its
//! own run dir, watched through `status.json` and its log, killed when dropped. Every wait
//! has a deadline and fails with the peer's log tail.
//!
//! Each test binary compiles this module on its own and uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use atoll::data::Corpus;
use atoll::manifest::Manifest;
use atoll::node::status::{self, StatusFile, TrainingStatus};
use atoll::proto::RawSettings;
use atoll::train::TrainConfig;

/// One multi-process test at a time within a test binary: three or more peer processes
/// already share the two cores, and timings should not depend on the other tests.
static SERIAL: Mutex<()> = Mutex::new(());
/// How often status files are polled.
pub const POLL: Duration = Duration::from_millis(100);
/// Where peers listen unless told otherwise.
pub const LOOPBACK_TCP: &str = "/ip4/127.0.0.1/tcp/0";
/// Lines of a peer's log shown when a test fails.
const LOG_TAIL_LINES: usize = 20;

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A fresh directory for one test's peers; kept (and printed) when `ATOLL_KEEP_DIRS` is set.
pub fn test_dir(prefix: &str) -> tempfile::TempDir {
    let keep = std::env::var_os("ATOLL_KEEP_DIRS").is_some();
    let dir = tempfile::Builder::new().prefix(prefix).disable_cleanup(keep).tempdir().unwrap();
    if keep {
        eprintln!("peer dirs in {}", dir.path().display());
    }
    dir
}

/// Protocol settings of the tiny runs: rounds of 200 ms (h 10 × 20 ms), grace cap 40 ms,
/// and the default fetch settings (atoll-net hedges and retries within the deadline).
pub fn tiny_protocol() -> RawSettings {
    RawSettings { h: 10, step_ms: 20, grace_cap_ms: 40, ..atoll::manifest::default_protocol() }
}

/// A manifest of `train` on the embedded corpus with [`tiny_protocol`] (epoch 0).
pub fn tiny_manifest(name: &str, train: TrainConfig) -> Manifest {
    Manifest::new(name, train, &Corpus::embedded().unwrap(), tiny_protocol())
}

/// Writes a manifest to `path` and returns the path.
pub fn write_manifest(path: PathBuf, m: &Manifest) -> PathBuf {
    std::fs::write(&path, m.to_bytes()).unwrap();
    path
}

/// The swarm tests' run: the tiny model, rounds of 200 ms, epoch now; in
/// `dir/manifest-in.json`.
pub fn swarm_manifest(dir: &Path, name: &str) -> PathBuf {
    let mut train = TrainConfig::tiny(7);
    train.val_every = 100;
    train.schedule.decay_steps = 2_000;
    let mut m = tiny_manifest(name, train);
    m.epoch_unix_ms = status::unix_ms();
    write_manifest(dir.join("manifest-in.json"), &m)
}

/// How a peer process was started, so it can be started again on the same run dir.
#[derive(Clone)]
pub struct Spec {
    pub dir: PathBuf,
    /// What the peer is: a training peer or a `--no-train` one.
    pub role: Role,
    pub bootstrap: Option<String>,
    /// Arguments added at the end, e.g. `--fault-injection`.
    pub extra: Vec<String>,
    /// The listen address (default `/ip4/127.0.0.1/tcp/0`).
    pub listen: String,
    /// A command the peer is started under, e.g. `ip netns exec NS` (default none).
    pub wrapper: Vec<String>,
}

/// The part of a peer's command line that says what it does.
#[derive(Clone)]
pub enum Role {
    /// `--config MANIFEST --shard SHARD`, and `--steps` or `--duration`.
    Train { manifest: PathBuf, shard: String, until: Until },
    /// `--no-train --run-id RUN_ID`.
    Serve { run_id: String },
}

/// When a training peer stops by itself.
#[derive(Clone, Copy, Debug)]
pub enum Until {
    Steps(u64),
    Secs(u64),
}

impl Spec {
    fn new(dir: PathBuf, role: Role) -> Spec {
        let listen = LOOPBACK_TCP.to_owned();
        Spec { dir, role, bootstrap: None, extra: Vec::new(), listen, wrapper: Vec::new() }
    }

    /// A training peer of `manifest`.
    pub fn train(dir: PathBuf, manifest: &Path, shard: &str, until: Until) -> Spec {
        let manifest = manifest.to_owned();
        let role = Role::Train { manifest, shard: shard.to_owned(), until };
        Spec::new(dir, role)
    }

    /// A `--no-train` peer of swarm `run_id`.
    pub fn serve(dir: PathBuf, run_id: &str) -> Spec {
        Spec::new(dir, Role::Serve { run_id: run_id.to_owned() })
    }

    pub fn bootstrap(mut self, addr: Option<String>) -> Spec {
        self.bootstrap = addr;
        self
    }

    pub fn listen(mut self, addr: &str) -> Spec {
        self.listen = addr.to_owned();
        self
    }

    pub fn wrapper(mut self, command: &[&str]) -> Spec {
        self.wrapper = command.iter().map(|s| s.to_string()).collect();
        self
    }

    pub fn arg(mut self, arg: &str) -> Spec {
        self.extra.push(arg.to_owned());
        self
    }

    /// The step target, for a training peer started with `--steps`.
    pub fn steps(&self) -> Option<u64> {
        match self.role {
            Role::Train { until: Until::Steps(n), .. } => Some(n),
            _ => None,
        }
    }
}

/// A running `atoll run`; killed when dropped. Its stdout and stderr go to `DIR/peer.log`.
pub struct Peer {
    pub name: String,
    pub spec: Spec,
    pub child: Child,
    pub exit: Option<ExitStatus>,
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
    pub fn start(name: &str, spec: Spec) -> Peer {
        std::fs::create_dir_all(&spec.dir).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(spec.dir.join("peer.log"))
            .unwrap();
        let bin = env!("CARGO_BIN_EXE_atoll");
        let mut cmd = match spec.wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.arg("run").arg("--run-dir").arg(&spec.dir);
        match &spec.role {
            Role::Train { manifest, shard, until } => {
                cmd.arg("--config").arg(manifest).args(["--shard", shard]);
                match until {
                    Until::Steps(n) => cmd.args(["--steps", &n.to_string()]),
                    Until::Secs(s) => cmd.args(["--duration", &s.to_string()]),
                };
            }
            Role::Serve { run_id } => {
                cmd.args(["--no-train", "--run-id", run_id]);
            }
        }
        cmd.args(["--listen", &spec.listen, "--no-mdns"]);
        if let Some(b) = &spec.bootstrap {
            cmd.args(["--bootstrap", b]);
        }
        cmd.args(&spec.extra);
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

    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// Sends a signal (`-TERM`, `-STOP`, …) with kill(1).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([sig, &self.pid()]).status().unwrap();
        assert!(ok.success(), "kill {sig} {} failed", self.name);
    }

    /// Kills the process and waits for it.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.exit = Some(self.child.wait().unwrap());
    }

    /// The exit status once the process has ended (remembered).
    pub fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().unwrap();
        }
        self.exit
    }

    pub fn status(&self) -> Option<StatusFile> {
        status::read(&self.spec.dir.join(status::FILE_NAME)).ok()
    }

    pub fn training(&self) -> Option<TrainingStatus> {
        self.status().and_then(|s| s.training)
    }

    /// The peer id, once the status file names it.
    pub fn peer_id(&self) -> Option<String> {
        self.status().map(|s| s.stats.peer_id)
    }

    /// Connected peers of the run, as the status file lists them.
    pub fn run_peers(&self) -> Vec<String> {
        self.status().map(|s| s.stats.run_peers).unwrap_or_default()
    }

    /// The whole log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.spec.dir.join("peer.log")).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let text = self.log();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "--- {} log tail ---\n{}",
            self.name,
            lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
        )
    }

    /// Fails the test (with the log) if the peer exited while it should be running.
    pub fn assert_alive(&mut self) {
        if let Some(exit) = self.poll_exit() {
            panic!("{} exited early ({exit})\n{}", self.name, self.log_tail());
        }
    }

    /// Polls `f` on the peer's training status until it holds, the peer exits or the
    /// deadline passes.
    pub fn wait_until(
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
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
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
    pub fn listen_addr(&mut self, within: Duration) -> String {
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

/// Polls `check` until it holds; past the deadline, or when a peer exits, fails with
/// `what` and every peer's log tail.
pub fn wait_for(
    what: &str,
    within: Duration,
    peers: &mut [Peer],
    mut check: impl FnMut(&[Peer]) -> bool,
) {
    let deadline = Instant::now() + within;
    loop {
        if check(peers) {
            return;
        }
        for p in peers.iter_mut() {
            p.assert_alive();
        }
        if Instant::now() >= deadline {
            let logs: Vec<String> = peers.iter().map(Peer::log_tail).collect();
            panic!("{what} not reached within {within:?}\n{}", logs.join("\n"));
        }
        std::thread::sleep(POLL);
    }
}

/// A swarm of training peers in `root/peer-I` (one per entry of `steps`), peer 0 first and
/// the others bootstrapping from it; `adjust` may change peer `I`'s spec.
pub fn swarm_with(
    root: &Path,
    name: &str,
    steps: &[u64],
    adjust: impl Fn(usize, Spec) -> Spec,
) -> Vec<Peer> {
    let manifest = swarm_manifest(root, name);
    let n = steps.len();
    let spec = |i: usize| {
        let dir = root.join(format!("peer-{i}"));
        adjust(i, Spec::train(dir, &manifest, &format!("{i}/{n}"), Until::Steps(steps[i])))
    };
    let mut peers = vec![Peer::start("peer 0", spec(0))];
    let addr = peers[0].listen_addr(Duration::from_secs(30));
    for i in 1..n {
        peers.push(Peer::start(&format!("peer {i}"), spec(i).bootstrap(Some(addr.clone()))));
    }
    peers
}

/// [`swarm_with`] on loopback with default specs.
pub fn swarm(root: &Path, name: &str, steps: &[u64]) -> Vec<Peer> {
    swarm_with(root, name, steps, |_, s| s)
}

/// Waits for every peer to finish on its own and checks that all exited 0.
pub fn wait_all_exit(peers: &mut [Peer], within: Duration) {
    let deadline = Instant::now() + within;
    for p in peers.iter_mut() {
        let left = deadline.saturating_duration_since(Instant::now());
        let exit = p.wait_exit(left);
        assert!(exit.success(), "{} exited with {exit}\n{}", p.name, p.log_tail());
    }
}

/// Final status of every peer: stopped, trained to its target, all with the same anchors.
pub fn assert_same_final_anchors(peers: &[Peer]) {
    let finals: Vec<TrainingStatus> = peers
        .iter()
        .map(|p| {
            let s = p.status().unwrap_or_else(|| panic!("{} left no status", p.name));
            assert!(!s.running, "{} says it is running after exiting", p.name);
            s.training.unwrap()
        })
        .collect();
    for (p, t) in peers.iter().zip(&finals) {
        if let Some(steps) = p.spec.steps() {
            assert_eq!(t.step, steps, "{} ended at step {}", p.name, t.step);
        }
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

/// Runs `atoll ARGS --run-dir RUN_DIR --config CONFIG` to the end (a local swarm command:
/// demo, chaos); fails the test with its output unless it exits 0. Returns its stdout.
pub fn run_swarm_command(args: &[&str], run_dir: &Path, config: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_atoll"))
        .args(args)
        .arg("--run-dir")
        .arg(run_dir)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "atoll {} failed\nstdout:\n{stdout}\nstderr:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
