//! Disk safety with real processes (issue 5, item 7):
//! - SIGKILL at seeded random instants while `atoll train` checkpoints every step always
//!   leaves a checkpoint that loads, and the next start resumes from it;
//! - a full disk under a training peer (`atoll run` on a tiny tmpfs; needs root) is a clear
//!   error naming the checkpoint and the cause, the peer keeps training, the previous
//!   checkpoint still loads, and once there is room again the next checkpoint is written;
//! - the same with files that cannot be written (any user): a directory where the
//!   checkpoint's temporary file or `metrics.jsonl` goes.
//!
//! `ATOLL_TEST_SEED=N` replays other kill instants (the seed in use is printed);
//! `ATOLL_KEEP_DIRS=1` keeps (and prints) the run dirs and logs.

mod common;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atoll::checkpoint;
use atoll::data::Corpus;
use atoll::fleet::{Process, Spec, Until};
use atoll::rundir::status;
use atoll::train::TrainConfig;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How often files and logs are polled.
const POLL: Duration = Duration::from_millis(10);
/// The tiny model of `TrainConfig::tiny` as `atoll train` flags (no validation on the way).
const TINY: &str = "--d-model 32 --layers 1 --heads 2 --context 16 --batch 4 --val-every 100000";

fn seed() -> u64 {
    let seed = std::env::var("ATOLL_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(7);
    eprintln!("ATOLL_TEST_SEED={seed}");
    seed
}

/// The last lines of a log file, for failure messages.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!("--- {} ---\n{}", log.display(), lines[lines.len().saturating_sub(25)..].join("\n"))
}

/// The step of the checkpoint in `run_dir` if one is there; panics if it does not load.
fn checkpoint_step(run_dir: &Path, log: &Path) -> Option<u64> {
    let path = checkpoint::path_in(run_dir);
    if !path.exists() {
        return None;
    }
    match checkpoint::load(&path) {
        Ok(c) => Some(c.meta.state.step),
        Err(e) => panic!("the checkpoint does not load: {e}\n{}", tail(log)),
    }
}

/// A process under test ([`Process`]: killed when dropped), logging to a file outside the
/// disk under test.
struct Proc {
    process: Process,
    log: PathBuf,
}

impl Proc {
    fn spawn(args: &[OsString], log: &Path) -> Proc {
        let exe = Path::new(env!("CARGO_BIN_EXE_atoll"));
        let process = Process::start(exe, args, &[], log).expect("cannot start atoll");
        Proc { process, log: log.to_owned() }
    }

    fn kill9(&mut self) {
        self.process.kill().unwrap();
    }

    fn terminate(&mut self, within: Duration) -> ExitStatus {
        self.process.signal("-TERM").unwrap();
        let deadline = Instant::now() + within;
        loop {
            if let Some(exit) = self.process.poll_exit().unwrap() {
                return exit;
            }
            assert!(Instant::now() < deadline, "no exit within {within:?}\n{}", tail(&self.log));
            std::thread::sleep(POLL);
        }
    }

    fn assert_alive(&mut self) {
        if let Some(exit) = self.process.poll_exit().unwrap() {
            panic!("the process exited ({exit}) while it should train\n{}", tail(&self.log));
        }
    }

    /// Polls `f` until it returns a value; fails if the process exits or time runs out.
    fn wait_for<T>(&mut self, what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + within;
        loop {
            if let Some(v) = f() {
                return v;
            }
            self.assert_alive();
            assert!(
                Instant::now() < deadline,
                "{what}: not within {within:?}\n{}",
                tail(&self.log)
            );
            std::thread::sleep(POLL);
        }
    }
}

// ---- SIGKILL during checkpoint writes ----------------------------------------------------

/// The arguments of `atoll train` on the tiny model, checkpointing every step.
fn train(run_dir: &Path, steps: u64) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["train".into(), "--run-dir".into(), run_dir.into()];
    let flags = format!("--steps {steps} --checkpoint-every 1 --seed 3 {TINY}");
    args.extend(flags.split(' ').map(OsString::from));
    args
}

/// Identity of the checkpoint file: it changes with every write (a new inode renamed over
/// it; or, were the file written in place, a new size or mtime).
fn identity(path: &Path) -> Option<(u64, u64, i64, i64, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.len()))
}

#[test]
fn sigkill_during_checkpoint_writes_leaves_a_loadable_checkpoint_that_resumes() {
    let _serial = common::serial();
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let tmp = common::test_dir("disk-kill-");
    let run_dir = tmp.path().join("run");
    let log = tmp.path().join("train.log");
    let ckpt = checkpoint::path_in(&run_dir);
    let temp = checkpoint::temp_path(&ckpt);
    let corpus = Corpus::embedded().unwrap();
    const ROUNDS: usize = 8;
    let (mut step, mut mid_write) = (0, 0);
    for round in 0..ROUNDS {
        let before = identity(&ckpt);
        let mut p = Proc::spawn(&train(&run_dir, 1_000_000), &log);
        // Once this process has written a checkpoint of its own...
        p.wait_for("a checkpoint of the new process", Duration::from_secs(30), || {
            identity(&ckpt).filter(|&i| Some(i) != before)
        });
        // ...kill it at a random instant, or (every other round) just after the next write
        // began. A write lasts from under a millisecond (no-op fsync) to tens: poll closely.
        if round % 2 == 0 {
            std::thread::sleep(Duration::from_micros(rng.random_range(0..30_000)));
        } else {
            let seen = identity(&ckpt);
            let deadline = Instant::now() + Duration::from_secs(5);
            while !temp.exists() && identity(&ckpt) == seen && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(20));
            }
            std::thread::sleep(Duration::from_micros(rng.random_range(0..500)));
        }
        p.kill9();
        mid_write += usize::from(temp.exists());
        let loaded = checkpoint::load(&ckpt).unwrap_or_else(|e| {
            panic!("round {round}: the checkpoint does not load after SIGKILL: {e}\n{}", tail(&log))
        });
        let s = loaded.meta.state.step;
        assert!(
            s > step,
            "round {round}: checkpoint step {s} after {step}: the restart did not resume"
        );
        loaded.into_trainer(&corpus).expect("the checkpoint does not restore a trainer");
        step = s;
    }
    eprintln!("{ROUNDS} kills, {mid_write} of them left a half-written temporary file");

    // A last start resumes from the last checkpoint (past any leftover temporary file) and
    // runs to its target.
    let out = Command::new(env!("CARGO_BIN_EXE_atoll"))
        .args(train(&run_dir, step + 20))
        .output()
        .unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "resume failed\n{stdout}\n{stderr}");
    assert!(stdout.contains("trained 20 steps"), "did not resume from step {step}\n{stdout}");
    assert!(stderr.contains("resuming from checkpoint"), "{stderr}");
    assert_eq!(checkpoint::load(&ckpt).unwrap().meta.state.step, step + 20);
    assert!(!temp.exists(), "a temporary file is left after a clean run");
}

// ---- A full disk and unwritable files under a training peer ------------------------------

/// The tiny model, validation (a metrics line) every 5 steps, rounds of 200 ms.
fn tiny_manifest(dir: &Path, name: &str) -> PathBuf {
    let mut train = TrainConfig::tiny(11);
    train.val_every = 5;
    train.schedule.decay_steps = 2_000;
    let mut m = common::tiny_manifest(name, train);
    m.epoch_unix_ms = status::unix_ms();
    common::write_manifest(dir.join(format!("{name}.json")), &m)
}

/// A lone training peer (`atoll run`) checkpointing every 10 steps.
fn peer(run_dir: &Path, manifest: &Path, log: &Path) -> Proc {
    let spec = Spec::train(run_dir.to_owned(), manifest, "0/1", Until::Steps(1_000_000))
        .arg("--checkpoint-every")
        .arg("10");
    Proc::spawn(&spec.command_line(), log)
}

/// Steps whose checkpoint write failed, from the log; every such error must name the
/// checkpoint's path and `cause`.
fn failed_checkpoints(log: &Path, ckpt: &Path, cause: &str) -> BTreeSet<u64> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut steps = BTreeSet::new();
    for line in text.lines().filter(|l| l.contains("cannot write checkpoint")) {
        let path = ckpt.display().to_string();
        assert!(
            line.contains(&path) && line.contains(cause),
            "unclear error (wanted {path} and {cause:?}): {line}"
        );
        steps.insert(field(line, "step=").unwrap_or_else(|| panic!("no step in {line}")));
    }
    steps
}

/// The number after `key` in a log line.
fn field(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

fn status_step(run_dir: &Path) -> Option<u64> {
    status::read(&run_dir.join(status::FILE_NAME)).ok()?.training.map(|t| t.step)
}

/// After write failures at `failed` steps: the previous checkpoint loads, training went on,
/// and once `unblock` has made room the next checkpoint is written; then a clean SIGTERM.
fn recovers(p: &mut Proc, run_dir: &Path, failed: &BTreeSet<u64>, unblock: impl FnOnce()) {
    let log = p.log.clone();
    let (first, last) = (failed.first().copied().unwrap(), failed.last().copied().unwrap());
    assert!(last > first, "training did not go on while writes failed: {failed:?}");
    let kept = checkpoint_step(run_dir, &log).expect("the previous checkpoint is gone");
    assert!(!failed.contains(&kept), "checkpoint at failed step {kept} ({failed:?})");
    unblock();
    let ckpt = p.wait_for("a checkpoint after the failures", Duration::from_secs(30), || {
        checkpoint_step(run_dir, &log).filter(|&s| s > last)
    });
    let now = p.wait_for("status.json past the failures", Duration::from_secs(30), || {
        status_step(run_dir).filter(|&s| s > last)
    });
    eprintln!("writes failed at steps {first}..={last}; then checkpoint {ckpt}, status {now}");
    let exit = p.terminate(Duration::from_secs(30));
    assert!(exit.success(), "the peer exited with {exit}\n{}", tail(&log));
    assert!(checkpoint_step(run_dir, &log).unwrap() >= ckpt);
}

/// A tmpfs mounted on a directory, unmounted when dropped (also when a test panics).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "atoll-test"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr);
            return Err(format!("mount -t tmpfs failed ({}): {}", out.status, why.trim()));
        }
        Ok(Tmpfs(dir.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount").arg(&self.0).status().is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// Appends zeros to `path` until the file system has no room left.
fn fill(path: &Path) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    let chunk = vec![0u8; 64 << 10];
    loop {
        match f.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(28) => return, // ENOSPC
            Err(e) => panic!("cannot fill the disk: {e}"),
        }
    }
}

/// Keeps a file system full: a failed checkpoint write removes its temporary file, and a
/// write renamed over an old file frees the old one's room; a thread takes that back within
/// a millisecond. Dropping it stops the thread and removes the filler file.
struct Filler {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Filler {
    fn start(path: PathBuf) -> Filler {
        fill(&path);
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (path.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                fill(&p);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Filler { path, stop, thread: Some(thread) }
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[test]
fn a_full_disk_is_a_clear_error_and_the_peer_keeps_training() {
    let _serial = common::serial();
    let tmp = common::test_dir("disk-full-");
    let mnt = tmp.path().join("disk");
    std::fs::create_dir(&mnt).unwrap();
    // The checkpoint of the tiny model is about 0.4 MB; the run dir needs about 2 MB.
    let _disk = match Tmpfs::mount(&mnt, "4m") {
        Ok(d) => d,
        Err(why) => {
            eprintln!("skipped: a full disk needs a small tmpfs (root): {why}");
            return;
        }
    };
    let run_dir = mnt.join("peer");
    let manifest = tiny_manifest(tmp.path(), "disk-full");
    let log = tmp.path().join("peer.log");
    let mut p = peer(&run_dir, &manifest, &log);
    p.wait_for("a first checkpoint", Duration::from_secs(60), || {
        checkpoint_step(&run_dir, &log).filter(|&s| s > 0)
    });

    // Full until checkpoints, status.json (every 500 ms) and metrics.jsonl (once its last
    // page is used up) all failed.
    let filler = Filler::start(mnt.join("filler"));
    let ckpt = checkpoint::path_in(&run_dir);
    let failed =
        p.wait_for("failed checkpoint, status and metrics writes", Duration::from_secs(30), || {
            let f = failed_checkpoints(&log, &ckpt, "No space left on device");
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let warned = |what: &str| {
                text.lines().any(|l| l.contains(what) && l.contains("No space left on device"))
            };
            let all = f.len() >= 3
                && warned("cannot write status.json")
                && warned("cannot append to metrics.jsonl");
            all.then_some(f)
        });
    recovers(&mut p, &run_dir, &failed, move || drop(filler));
}

#[test]
fn unwritable_checkpoint_and_metrics_files_do_not_stop_the_peer() {
    let _serial = common::serial();
    let tmp = common::test_dir("disk-blocked-");
    let run_dir = tmp.path().join("peer");
    // A directory where metrics.jsonl goes: every append fails.
    let metrics = run_dir.join(atoll::metrics::FILE_NAME);
    std::fs::create_dir_all(&metrics).unwrap();
    let manifest = tiny_manifest(tmp.path(), "disk-blocked");
    let log = tmp.path().join("peer.log");
    let mut p = peer(&run_dir, &manifest, &log);
    p.wait_for("a first checkpoint", Duration::from_secs(60), || {
        checkpoint_step(&run_dir, &log).filter(|&s| s > 0)
    });

    // A directory where the checkpoint's temporary file goes: every write fails (made
    // between two writes, while the temporary file does not exist).
    let ckpt = checkpoint::path_in(&run_dir);
    let blocker = checkpoint::temp_path(&ckpt);
    p.wait_for("blocking checkpoint writes", Duration::from_secs(10), || {
        std::fs::create_dir_all(blocker.join("in-the-way")).ok()
    });
    let failed = p.wait_for("three failed checkpoints", Duration::from_secs(30), || {
        let f = failed_checkpoints(&log, &ckpt, "Is a directory");
        (f.len() >= 3).then_some(f)
    });
    let text = std::fs::read_to_string(&log).unwrap();
    let warning = text.lines().find(|l| l.contains("cannot append to metrics.jsonl"));
    let warning = warning.unwrap_or_else(|| panic!("no metrics warning\n{}", tail(&log)));
    assert!(warning.contains(&metrics.display().to_string()), "{warning}");
    recovers(&mut p, &run_dir, &failed, || std::fs::remove_dir_all(&blocker).unwrap());
}
