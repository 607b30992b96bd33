//! Peer processes: the one place that starts, signals, watches and stops `atoll`
//! processes, used by `atoll demo`, `atoll chaos` and the multi-process tests.
//!
//! A [`Spec`] says what one `atoll run` does (train a shard of a manifest or serve a
//! run, where it listens, whom it bootstraps from); [`Process`] runs a command line with
//! its output appended to a log file, and kills it when dropped, so no test or command
//! leaves peers behind. Progress is read from the peer's `status.json`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use crate::backend::Backend;
use crate::rundir::status::{self, StatusFile};

/// Name of a peer's log file in its run dir.
pub const LOG_FILE: &str = "peer.log";
/// Where local peers listen unless told otherwise (OS-chosen port).
pub const LOOPBACK_TCP: &str = "/ip4/127.0.0.1/tcp/0";

/// When a training peer stops by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// `--steps N`.
    Steps(u64),
    /// `--duration S` (seconds).
    Seconds(u64),
}

/// What a peer does.
#[derive(Clone, Debug)]
pub enum Role {
    /// `--config MANIFEST --shard SHARD` and `--steps` or `--duration`.
    Train { manifest: PathBuf, shard: String, until: Until },
    /// `--no-train --run-name NAME`.
    Serve { run_name: String },
    /// `--join RUN_ID@MULTIADDR` and `--steps` or `--duration`: the manifest is fetched
    /// from the swarm, the shard taken from the peer id.
    Join { target: String, until: Until },
}

/// How one `atoll run` is started, kept so it can be started again on the same run dir.
#[derive(Clone, Debug)]
pub struct Spec {
    pub dir: PathBuf,
    pub role: Role,
    pub bootstrap: Vec<String>,
    pub listen: String,
    pub backend: Option<Backend>,
    /// `--data`: train on this file or directory instead of the embedded corpus.
    pub data: Option<PathBuf>,
    /// Arguments added at the end, e.g. `--fault-injection`.
    pub extra: Vec<String>,
    /// A command the peer runs under, e.g. `ip netns exec NS` (default none).
    pub wrapper: Vec<String>,
}

impl Spec {
    fn new(dir: PathBuf, role: Role) -> Spec {
        Spec {
            dir,
            role,
            bootstrap: Vec::new(),
            listen: LOOPBACK_TCP.to_owned(),
            backend: None,
            data: None,
            extra: Vec::new(),
            wrapper: Vec::new(),
        }
    }

    /// A training peer of `manifest`, shard `shard` (`I/N`).
    pub fn train(dir: PathBuf, manifest: &Path, shard: &str, until: Until) -> Spec {
        let role = Role::Train { manifest: manifest.to_owned(), shard: shard.to_owned(), until };
        Spec::new(dir, role)
    }

    /// A `--no-train` peer of the run named `run_name`.
    pub fn serve(dir: PathBuf, run_name: &str) -> Spec {
        Spec::new(dir, Role::Serve { run_name: run_name.to_owned() })
    }

    /// A training peer that joins with `--join TARGET` (`RUN_ID@MULTIADDR`).
    pub fn join(dir: PathBuf, target: &str, until: Until) -> Spec {
        Spec::new(dir, Role::Join { target: target.to_owned(), until })
    }

    /// Adds bootstrap addresses.
    pub fn bootstrap(mut self, addrs: impl IntoIterator<Item = String>) -> Spec {
        self.bootstrap.extend(addrs);
        self
    }

    pub fn listen(mut self, addr: &str) -> Spec {
        addr.clone_into(&mut self.listen);
        self
    }

    pub fn wrapper(mut self, command: &[&str]) -> Spec {
        self.wrapper = command.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    pub fn arg(mut self, arg: &str) -> Spec {
        self.extra.push(arg.to_owned());
        self
    }

    pub fn backend(mut self, backend: Backend) -> Spec {
        self.backend = Some(backend);
        self
    }

    pub fn data(mut self, data: Option<&Path>) -> Spec {
        self.data = data.map(Path::to_owned);
        self
    }

    /// The step target of a training peer started with `--steps`.
    pub fn steps(&self) -> Option<u64> {
        match self.role {
            Role::Train { until: Until::Steps(n), .. }
            | Role::Join { until: Until::Steps(n), .. } => Some(n),
            _ => None,
        }
    }

    /// The arguments of `atoll` for this peer, starting with `run` (no mDNS: local peers
    /// bootstrap from each other).
    pub fn command_line(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec!["run".into(), "--run-dir".into(), self.dir.clone().into()];
        let mut push = |items: &[&str]| a.extend(items.iter().map(OsString::from));
        let until_flag = |until: &Until| match until {
            Until::Steps(n) => ["--steps".to_owned(), n.to_string()],
            Until::Seconds(s) => ["--duration".to_owned(), s.to_string()],
        };
        match &self.role {
            Role::Train { manifest, shard, until } => {
                push(&["--config"]);
                a.push(manifest.clone().into());
                a.extend(["--shard", shard].map(OsString::from));
                a.extend(until_flag(until).map(OsString::from));
            }
            Role::Join { target, until } => {
                a.extend(["--join", target].map(OsString::from));
                a.extend(until_flag(until).map(OsString::from));
            }
            Role::Serve { run_name } => {
                a.extend(["--no-train", "--run-name", run_name].map(OsString::from))
            }
        }
        a.extend(["--listen", &self.listen, "--no-mdns"].map(OsString::from));
        if let Some(b) = self.backend {
            a.extend(["--backend", b.name()].map(OsString::from));
        }
        if let Some(d) = &self.data {
            a.push("--data".into());
            a.push(d.clone().into());
        }
        for b in &self.bootstrap {
            a.extend(["--bootstrap", b].map(OsString::from));
        }
        a.extend(self.extra.iter().map(OsString::from));
        a
    }

    /// Starts the peer with the `atoll` executable `exe`, logging to `DIR/peer.log`
    /// (appended: a restarted peer's log keeps its earlier lives).
    pub fn start(&self, exe: &Path) -> std::io::Result<Process> {
        std::fs::create_dir_all(&self.dir)?;
        Process::start(exe, &self.command_line(), &self.wrapper, &self.dir.join(LOG_FILE))
    }
}

/// A running process; killed (and continued first, if stopped) when dropped.
#[derive(Debug)]
pub struct Process {
    child: Child,
    exit: Option<ExitStatus>,
    log: PathBuf,
}

impl Process {
    /// Runs `exe args` (under `wrapper`, if any) with no stdin, stdout and stderr appended
    /// to `log`, and `RUST_LOG=info` unless set.
    pub fn start(
        exe: &Path,
        args: &[OsString],
        wrapper: &[String],
        log: &Path,
    ) -> std::io::Result<Process> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        cmd.args(args);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        let child = cmd.stdin(Stdio::null()).stdout(file.try_clone()?).stderr(file).spawn()?;
        Ok(Process { child, exit: None, log: log.to_owned() })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal (`-TERM`, `-STOP`, `-CONT`, …) with kill(1).
    pub fn signal(&self, sig: &str) -> std::io::Result<()> {
        let ok = Command::new("kill").args([sig, &self.pid().to_string()]).status()?;
        if ok.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("kill {sig} {} failed ({ok})", self.pid())))
        }
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub fn kill(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(exit) = self.exit {
            return Ok(exit);
        }
        self.child.kill()?;
        let exit = self.child.wait()?;
        self.exit = Some(exit);
        Ok(exit)
    }

    /// The exit status once the process has ended (remembered).
    pub fn poll_exit(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait()?;
        }
        Ok(self.exit)
    }

    /// The whole log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.exit.is_none() {
            // A stopped process must be continued to die promptly on some systems.
            let _ = self.signal("-CONT");
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The last `lines` lines of a log file ("" if unreadable).
pub fn tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The status file of the peer in `dir`, if readable.
pub fn status_of(dir: &Path) -> Option<StatusFile> {
    status::read(&dir.join(status::FILE_NAME)).ok()
}

/// The TCP listen address (with `/p2p/<id>`) that the peer process `pid` wrote to its
/// status file at `since_unix_ms` or later: a status file of an earlier life is skipped.
pub fn listen_addr(dir: &Path, pid: u32, since_unix_ms: u64) -> Option<String> {
    let s = status_of(dir)?;
    let fresh = s.running && s.pid == pid && s.updated_unix_ms >= since_unix_ms;
    s.stats.listen_addrs.into_iter().find(|a| a.contains("/tcp/")).filter(|_| fresh)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_training_peers_command_line() {
        let spec = Spec::train("/r/p0".into(), Path::new("/r/m.json"), "0/4", Until::Steps(300))
            .bootstrap(Some("/ip4/127.0.0.1/tcp/9/p2p/x".to_owned()))
            .backend(Backend::Flex)
            .arg("--fault-injection");
        let line: Vec<String> =
            spec.command_line().iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            line.join(" "),
            "run --run-dir /r/p0 --config /r/m.json --shard 0/4 --steps 300 \
             --listen /ip4/127.0.0.1/tcp/0 --no-mdns --backend flex \
             --bootstrap /ip4/127.0.0.1/tcp/9/p2p/x --fault-injection"
        );
        let serve = Spec::serve("/r/s".into(), "demo").listen("/ip4/127.0.0.1/udp/0/quic-v1");
        let line: Vec<String> =
            serve.command_line().iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            line.join(" "),
            "run --run-dir /r/s --no-train --run-name demo --listen /ip4/127.0.0.1/udp/0/quic-v1 --no-mdns"
        );
    }

    #[test]
    fn a_dropped_process_is_killed_and_its_output_logged() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("p.log");
        let args: Vec<OsString> = vec!["-c".into(), "echo started; exec sleep 600".into()];
        let mut p = Process::start(Path::new("sh"), &args, &[], &log).unwrap();
        let pid = p.pid();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !p.log().contains("started") {
            assert!(std::time::Instant::now() < deadline, "no output logged");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(p.poll_exit().unwrap().is_none());
        drop(p);
        let alive = Command::new("kill").args(["-0", &pid.to_string()]).status().unwrap();
        assert!(!alive.success(), "process {pid} outlived its handle");
    }
}
