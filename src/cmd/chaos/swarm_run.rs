//! The chaos run itself: the peer processes, their fault schedule (kill, restart, pause,
//! resume) applied as the clock reaches each fault, live lines, and the outcome.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use atoll::chaos::{self, Fault, FaultKind, Incarnation};
use atoll::fleet::{Process, Spec, Until};
use atoll::manifest::Manifest;
use atoll::rundir::{ledger, status};

use super::swarm::{self, Console, Launcher};
use super::{Args, Outcome, REFRESH};

/// One peer's slot in the swarm.
enum Slot {
    Up { child: Process },
    Paused { child: Process, until_ms: u64 },
    Down { restart_ms: u64 },
    Exited,
}

struct Swarm<'a> {
    args: &'a Args,
    dir: &'a Path,
    manifest: PathBuf,
    slots: Vec<Slot>,
    /// Index into `lives` of each slot's current process.
    current: Vec<usize>,
    lives: Vec<Incarnation>,
    console: Console,
    window: Instant,
    window_unix_ms: u64,
    out: Outcome,
}

pub(super) fn run_swarm(
    args: &Args,
    dir: &Path,
    mut manifest: Manifest,
    faults: &[Fault],
) -> anyhow::Result<Outcome> {
    swarm::prepare_dir(dir, &[])?;
    // Each run has its own timeline (and so its own run id).
    manifest.epoch_unix_ms = status::unix_ms();
    let manifest_path = swarm::save_manifest(dir, &manifest)?;
    let settings = manifest.validate()?;
    let mut s = Swarm {
        args,
        dir,
        manifest: manifest_path,
        slots: Vec::new(),
        current: Vec::new(),
        lives: Vec::new(),
        console: Console::new(),
        window: Instant::now(),
        window_unix_ms: status::unix_ms(),
        out: Outcome::default(),
    };
    let result = s.drive(faults);
    for slot in &mut s.slots {
        // Dropping a process continues and kills it.
        *slot = Slot::Exited;
    }
    s.console.clear();
    result?;
    let dirs: Vec<PathBuf> = (0..args.peers).map(|i| swarm::peer_dir(dir, i)).collect();
    let group = args.method.is_group();
    let mut merges = Vec::new();
    let mut finals = Vec::new();
    let mut hashes = Vec::new();
    let mut finished = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        merges.extend(ledger::read(d).with_context(|| format!("cannot read {}", d.display()))?);
        let st = status::read(&d.join(status::FILE_NAME))
            .with_context(|| format!("cannot read the status of {}", d.display()))?;
        let t = st.training.unwrap_or_default();
        // The last process in a dir wrote its status last: a finished peer's final count
        // (the live reads may have missed its last second).
        let life = &mut s.lives[s.current[i]];
        life.tokens_last = life.tokens_last.max(t.tokens);
        // A group's killed or evicted members have no final model, and no checkpoint.
        if group && t.final_val_bpb.is_none() {
            continue;
        }
        finals.extend(t.final_val_bpb);
        hashes.push(t.anchor_hashes);
        finished.push(d.as_path());
        if group {
            continue;
        }
        if let Err(e) = atoll::checkpoint::load(&atoll::checkpoint::path_in(d)) {
            tracing::error!(dir = %d.display(), error = %e, "final checkpoint does not load");
            s.out.unreadable_checkpoints += 1;
        }
    }
    let mut out = s.out;
    let window_end = s.window_unix_ms + args.duration * 1000;
    // A group's mean covers the whole model: one "fragment".
    let fragments = if group { 1 } else { settings.raw().fragments };
    out.goodput = chaos::goodput(&s.lives, &merges, fragments);
    out.useful_tokens = chaos::useful_tokens(&merges, fragments);
    out.finished = finished.len();
    // Periods count from the swarm's first merge: starting the processes is not downtime.
    let first = merges.iter().map(|m| m.unix_ms).min().unwrap_or(s.window_unix_ms);
    out.uptime = chaos::uptime(&merges, first, window_end, settings.period_ms());
    out.rejoined = chaos::rejoined(&s.lives, &merges);
    out.tokens_computed = s.lives.iter().map(Incarnation::computed).sum();
    out.final_val_bpb = (finals.len() == finished.len() && !finals.is_empty())
        .then(|| finals.iter().sum::<f64>() / finals.len() as f64);
    out.anchors_agree = hashes.windows(2).all(|w| w[0] == w[1]);
    out.consensus_distance = swarm::consensus(&manifest, finished.iter().copied()).ok();
    println!(
        "  goodput {:.3} ({} useful tokens), uptime {:.3}, final val_bpb {} ({} of {} peers \
         finished), anchors {}",
        out.goodput,
        out.useful_tokens,
        out.uptime,
        out.final_val_bpb.map_or("-".into(), |v| format!("{v:.3}")),
        out.finished,
        dirs.len(),
        if out.anchors_agree { "identical" } else { "DIFFER" }
    );
    Ok(out)
}

impl Swarm<'_> {
    fn elapsed_ms(&self) -> u64 {
        self.window.elapsed().as_millis() as u64
    }

    fn say(&self, msg: String) {
        let secs = self.elapsed_ms() as f64 / 1000.0;
        self.console.say(&format!("[{secs:>5.1} s] {msg}"));
    }

    fn launcher(&self) -> Launcher<'_> {
        Launcher {
            dir: self.dir,
            manifest: &self.manifest,
            run: &self.args.run,
            pace: self.args.pace,
            peers: self.args.peers,
        }
    }

    /// The command line of peer `i`, training until the window ends.
    fn spec(&self, i: u32, bootstrap: &[String]) -> Spec {
        let left_ms = (self.args.duration * 1000).saturating_sub(self.elapsed_ms());
        let until = Until::Seconds(left_ms.div_ceil(1000).max(1));
        let mut spec = self.launcher().spec(i, until, self.args.run.backend, bootstrap);
        if self.args.method.is_group() {
            let (group, timeout) = (self.args.peers.to_string(), self.args.barrier_timeout);
            spec = spec
                .arg("--method")
                .arg(self.args.method.name())
                .arg("--group")
                .arg(&group)
                .arg("--elastic")
                .arg("--barrier-timeout")
                .arg(&timeout.to_string());
        }
        spec
    }

    /// Starts peer `i` and records a new life.
    fn launch(&mut self, i: u32, bootstrap: &[String], restart: bool) -> anyhow::Result<Process> {
        let child = swarm::start(&self.spec(i, bootstrap))?;
        self.record_life(i, restart);
        Ok(child)
    }

    fn record_life(&mut self, i: u32, restart: bool) {
        self.lives.push(Incarnation {
            peer: i as usize,
            proto_id: String::new(),
            started_unix_ms: status::unix_ms(),
            tokens_at_start: 0,
            tokens_last: 0,
            restart,
        });
    }

    fn drive(&mut self, faults: &[Fault]) -> anyhow::Result<()> {
        let n = self.args.peers;
        let spec = self.spec(0, &[]);
        self.record_life(0, false);
        let (first, addr) = self.launcher().start_first(&spec)?;
        self.slots.push(Slot::Up { child: first });
        self.current.push(0);
        for i in 1..n {
            let child = self.launch(i, std::slice::from_ref(&addr), false)?;
            self.slots.push(Slot::Up { child });
            self.current.push(self.lives.len() - 1);
        }
        self.window = Instant::now();
        self.window_unix_ms = status::unix_ms();
        for _ in 0..n {
            self.console.add_peer(0);
        }
        let window_ms = self.args.duration * 1000;
        // Finishing takes a few quiet periods; a swarm that has not ended by then is stuck.
        let give_up = Duration::from_millis(window_ms) + Duration::from_secs(300);
        let mut pending = faults.iter().peekable();
        loop {
            let now = self.elapsed_ms();
            while let Some(f) = pending.next_if(|f| f.at_ms <= now) {
                self.inject(f)?;
            }
            for i in 0..n as usize {
                self.tend(i, now)?;
            }
            self.observe();
            if self.slots.iter().all(|s| matches!(s, Slot::Exited)) {
                return Ok(());
            }
            if self.window.elapsed() > give_up {
                bail!("the swarm did not finish within {} s", give_up.as_secs());
            }
            std::thread::sleep(REFRESH);
        }
    }

    fn inject(&mut self, f: &Fault) -> anyhow::Result<()> {
        let group = self.args.method.is_group();
        let members =
            self.slots.iter().filter(|s| matches!(s, Slot::Up { .. } | Slot::Paused { .. }));
        let running = members.count();
        let slot = std::mem::replace(&mut self.slots[f.peer], Slot::Exited);
        let Slot::Up { mut child } = slot else {
            self.say(format!("peer {} is not running; fault at {} ms skipped", f.peer, f.at_ms));
            self.slots[f.peer] = slot;
            self.out.skipped_faults += 1;
            return Ok(());
        };
        if group && running <= 1 {
            self.say(format!("peer {} is the group's last member; fault skipped", f.peer));
            self.slots[f.peer] = Slot::Up { child };
            self.out.skipped_faults += 1;
            return Ok(());
        }
        self.slots[f.peer] = match f.kind {
            FaultKind::Kill { .. } if group => {
                child.kill().context("cannot kill a peer")?;
                self.out.kills += 1;
                self.say(format!("kill peer {} (the group cannot re-admit it: stays out)", f.peer));
                Slot::Exited
            }
            FaultKind::Kill { down_ms } => {
                child.kill().context("cannot kill a peer")?;
                self.out.kills += 1;
                self.say(format!("kill peer {} (down {:.1} s)", f.peer, down_ms as f64 / 1000.0));
                Slot::Down { restart_ms: f.at_ms + down_ms }
            }
            FaultKind::Pause { for_ms } => {
                child.signal("-STOP")?;
                self.out.pauses += 1;
                self.say(format!("pause peer {} for {:.1} s", f.peer, for_ms as f64 / 1000.0));
                Slot::Paused { child, until_ms: f.at_ms + for_ms }
            }
        };
        Ok(())
    }

    /// Restarts, resumes and reaps peer `i` as its slot requires.
    fn tend(&mut self, i: usize, now: u64) -> anyhow::Result<()> {
        let slot = std::mem::replace(&mut self.slots[i], Slot::Exited);
        self.slots[i] = match slot {
            Slot::Down { restart_ms } if restart_ms <= now => {
                let dir = swarm::peer_dir(self.dir, i as u32);
                let ckpt = atoll::checkpoint::path_in(&dir);
                if ckpt.exists() {
                    if let Err(e) = atoll::checkpoint::load(&ckpt) {
                        self.say(format!("peer {i}: checkpoint does not load: {e}"));
                        self.out.unreadable_checkpoints += 1;
                    }
                }
                let bootstrap = self.live_addrs();
                let child = self.launch(i as u32, &bootstrap, true)?;
                self.current[i] = self.lives.len() - 1;
                self.out.restarts += 1;
                self.say(format!("restart peer {i} ({} bootstrap peers)", bootstrap.len()));
                Slot::Up { child }
            }
            Slot::Paused { child, until_ms } if until_ms <= now => {
                child.signal("-CONT")?;
                self.say(format!("resume peer {i}"));
                Slot::Up { child }
            }
            Slot::Up { mut child } => match child.poll_exit()? {
                None => Slot::Up { child },
                Some(exit) if exit.success() => {
                    self.say(format!("peer {i} finished"));
                    Slot::Exited
                }
                Some(exit) => {
                    let tail = swarm::log_tail(&swarm::peer_dir(self.dir, i as u32));
                    self.say(format!("peer {i} exited abnormally ({exit}):\n{tail}"));
                    self.out.abnormal_exits += 1;
                    Slot::Exited
                }
            },
            other => other,
        };
        Ok(())
    }

    /// TCP addresses of the peers that run now (the bootstrap of a restarted peer).
    fn live_addrs(&self) -> Vec<String> {
        let mut addrs = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            if let Slot::Up { child } = slot {
                let path = swarm::peer_dir(self.dir, i as u32).join(status::FILE_NAME);
                if let Ok(s) = status::read(&path) {
                    if s.pid == child.pid() {
                        addrs.extend(
                            s.stats.listen_addrs.into_iter().filter(|a| a.contains("/tcp/")),
                        );
                    }
                }
            }
        }
        addrs
    }

    /// Reads every running peer's status: token counts of its life, the live line.
    fn observe(&mut self) {
        let mut lines = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let dir = swarm::peer_dir(self.dir, i as u32);
            let (pid, state) = match slot {
                Slot::Up { child } => (Some(child.pid()), ""),
                Slot::Paused { child, .. } => (Some(child.pid()), "paused "),
                Slot::Down { .. } => (None, "down "),
                Slot::Exited => (None, "exited "),
            };
            if let Some(pid) = pid {
                if let Ok(st) = status::read(&dir.join(status::FILE_NAME)) {
                    if let (true, Some(t)) = (st.pid == pid, st.training.as_ref()) {
                        let life = &mut self.lives[self.current[i]];
                        life.proto_id.clone_from(&t.proto_id);
                        life.tokens_at_start = t.tokens_at_start;
                        life.tokens_last = life.tokens_last.max(t.tokens);
                    }
                }
            }
            lines.push((dir, state));
        }
        self.console.refresh(lines.iter().map(|(d, s)| (d.as_path(), *s)));
    }
}
