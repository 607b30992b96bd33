//! Helpers of the multi-process tests: real `atoll run` processes on 127.0.0.1, each in its
//! own run dir, watched through `status.json` and its log, killed when dropped. Every wait
//! has a deadline and fails with the peer's log tail.
//!
//! Each test binary compiles this module on its own and uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use atoll::data::Corpus;
pub use atoll::fleet::{Process, Role, Spec, Until};
use atoll::manifest::Manifest;
use atoll::proto::RawSettings;
use atoll::rundir::status::{self, StatusFile, TrainingStatus};
use atoll::train::TrainConfig;
#[allow(unused_imports)] // each test binary uses part of it
pub use swarm::{assert_same_final_anchors, swarm, swarm_of, swarm_with, wait_all_exit};

mod swarm;

/// One multi-process test at a time within a test binary: three or more peer processes
/// already share the two cores, and timings should not depend on the other tests.
static SERIAL: Mutex<()> = Mutex::new(());
/// How often status files are polled.
pub const POLL: Duration = Duration::from_millis(100);
/// Lines of a peer's log shown when a test fails.
const LOG_TAIL_LINES: usize = 20;

/// Every training peer of these tests steps at most once per `STEP_MS` (`--min-step-ms`),
/// however fast the CPU: a step count is then a *least* duration ([`steps_for`]), and a
/// scenario that needs peers still training at some point holds on any faster machine.
/// Rounds are wall-clock (200 ms), so the floor also fixes the steps per round. Slower
/// machines only stretch a run: deadlines on step counts ([`deadline_for`]) allow a sixth
/// of the floor's rate, and `ATOLL_TEST_SLOWDOWN=F` runs every peer `F` times slower
/// (`--slowdown F`) to check it.
pub const STEP_MS: u64 = 5;
/// Set to a factor (e.g. `3`) to slow every test peer's steps by that much.
pub const SLOWDOWN_ENV: &str = "ATOLL_TEST_SLOWDOWN";

/// The most steps a test peer makes in `d` (its step floor): a peer given this many steps
/// trains for at least `d`.
pub fn steps_for(d: Duration) -> u64 {
    (d.as_millis() as u64).div_ceil(STEP_MS)
}

/// How long `steps` steps of `peers` peers sharing this machine may take before a wait on
/// them fails: six times the floor (a machine several times slower than the floor's rate, or
/// peers slowed with [`SLOWDOWN_ENV`]), times the peers per core (each gets that share of
/// the CPU once the floor no longer binds: 6 peers on 2 cores ran at 12× the floor in CI,
/// against 4× here), plus a minute for start-up and the finish.
pub fn deadline_for(steps: u64, peers: usize) -> Duration {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_core = peers.div_ceil(cores).max(1) as u64;
    Duration::from_millis(steps * STEP_MS * 6 * per_core) + Duration::from_secs(60)
}

/// `ATOLL_TEST_SLOWDOWN`, when set: the factor every test peer is slowed by.
pub fn slowdown() -> Option<f64> {
    let v = std::env::var(SLOWDOWN_ENV).ok()?;
    let f: f64 = v.parse().unwrap_or_else(|_| panic!("{SLOWDOWN_ENV}={v:?} is not a number"));
    Some(f)
}

/// The pace of the tests' peers as flags of `atoll run`, `demo` or `chaos`: the step floor
/// and the slowdown of [`SLOWDOWN_ENV`], if set.
pub fn pace_flags() -> Vec<String> {
    let mut flags = vec!["--min-step-ms".to_owned(), STEP_MS.to_string()];
    if let Some(f) = slowdown() {
        flags.extend(["--slowdown".to_owned(), f.to_string()]);
    }
    flags
}

/// A training peer's `spec` with [`pace_flags`] (a spec that sets its own floor keeps it).
pub fn paced(spec: &Spec) -> Spec {
    let mut spec = spec.clone();
    if !matches!(spec.role, Role::Train { .. } | Role::Join { .. }) {
        return spec;
    }
    let own_floor = spec.extra.iter().any(|a| a == "--min-step-ms");
    // The floor's flag and value come first: skipped when the spec has its own.
    let skip = if own_floor { 2 } else { 0 };
    spec.extra.extend(pace_flags().into_iter().skip(skip));
    spec
}

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
    // Strict states are the run's default; `ATOLL_STRICT_STATES=0` runs the swarm tests
    // with the plurality rule instead (a measurement: bench/RESULTS.md, "Strict states").
    if std::env::var("ATOLL_STRICT_STATES").is_ok_and(|v| v == "0") {
        m.protocol.strict_states = false;
    }
    write_manifest(dir.join("manifest-in.json"), &m)
}

/// A running `atoll run` (an [`atoll::fleet::Process`]: killed when dropped). Its stdout
/// and stderr go to `DIR/peer.log`.
pub struct Peer {
    pub name: String,
    pub spec: Spec,
    pub process: Process,
}

impl Peer {
    /// Starts `spec` [`paced`] (the spec kept is the one given, so a restart paces again).
    pub fn start(name: &str, spec: Spec) -> Peer {
        let process = paced(&spec)
            .start(Path::new(env!("CARGO_BIN_EXE_atoll")))
            .expect("cannot start atoll run");
        Peer { name: name.to_owned(), spec, process }
    }

    pub fn pid(&self) -> String {
        self.process.pid().to_string()
    }

    /// Sends a signal (`-TERM`, `-STOP`, …) with kill(1).
    pub fn signal(&self, sig: &str) {
        if let Err(e) = self.process.signal(sig) {
            panic!("{}: {e}", self.name);
        }
    }

    /// Kills the process and waits for it.
    pub fn kill(&mut self) {
        self.process.kill().unwrap();
    }

    /// The exit status once the process has ended (remembered).
    pub fn poll_exit(&mut self) -> Option<ExitStatus> {
        self.process.poll_exit().unwrap()
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
        self.process.log()
    }

    pub fn log_tail(&self) -> String {
        format!("--- {} log tail ---\n{}", self.name, self.process.log_tail(LOG_TAIL_LINES))
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

/// Runs `atoll ARGS` to the end; returns its exit code and stdout.
pub fn atoll(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_atoll")).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = out.status.code().unwrap_or(-1);
    if code == 101 || code == -1 {
        panic!(
            "atoll {} crashed: {}\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (code, stdout)
}

/// The peer's `swarm.json`, once written.
pub fn swarm_view(dir: &Path) -> Option<atoll::heartbeat::table::SwarmView> {
    atoll::rundir::swarm::read(&dir.join(atoll::rundir::swarm::FILE_NAME)).ok()
}
