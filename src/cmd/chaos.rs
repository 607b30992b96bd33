//! `atoll chaos`: a local swarm under a seeded fault schedule. Peers are killed (and
//! restarted on their run dirs after a downtime) and paused (SIGSTOP/SIGCONT) while they
//! train for `--duration` seconds; then the swarm finishes as usual (merge until quiet,
//! evaluate the final anchors). A failure-free run of the same manifest and seed comes
//! first as the baseline. The figures go to `RUN_DIR/chaos.json`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use atoll::backend::Backend;
use atoll::chaos::{self, Fault, FaultKind, Incarnation, ScheduleConfig};
use atoll::manifest::Manifest;
use atoll::node::{ledger, status};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget};
use serde::Serialize;

use super::swarm;

/// Name of the report in the chaos run dir.
pub const REPORT_FILE: &str = "chaos.json";
const REFRESH: Duration = Duration::from_millis(100);
const PLAIN_EVERY: Duration = Duration::from_secs(15);

/// Arguments of `atoll chaos`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory of the run: `baseline/` and `chaos/` swarms and chaos.json (replaced).
    #[arg(long, default_value = "runs/chaos")]
    pub run_dir: PathBuf,
    /// Number of peer processes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=16))]
    pub peers: u32,
    /// Seconds every peer trains (faults happen inside this window).
    #[arg(long, default_value_t = 600)]
    pub duration: u64,
    /// Mean seconds between failures of one peer.
    #[arg(long, default_value_t = 120)]
    pub mtbf: u64,
    /// Mean seconds a killed peer stays down (uniform in ½× to 1½×).
    #[arg(long, default_value_t = 20)]
    pub downtime: u64,
    /// Mean seconds a paused peer stays stopped (uniform in ½× to 1½×).
    #[arg(long, default_value_t = 15)]
    pub pause: u64,
    /// Share of failures that are kills; the others are pauses.
    #[arg(long, default_value_t = 0.5)]
    pub kill_share: f64,
    /// Seed of the fault schedule and of the run (weights, data order).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Use this run manifest instead of the default one (its `epoch_unix_ms` is reset).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Train on this UTF-8 text file or directory instead of the embedded corpus.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// CPU backend of every peer.
    #[arg(long, default_value = "flex")]
    pub backend: Backend,
    /// Skip the failure-free baseline run.
    #[arg(long)]
    pub no_baseline: bool,
}

/// `chaos.json`.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Tokens that reached a merged anchor ÷ tokens computed (chaos run).
    pub goodput: f64,
    /// Share of protocol periods of the training window (from the first merge on) with at
    /// least one merge.
    pub uptime: f64,
    /// Mean final `val_bpb` of the peers (final anchors) in the chaos run.
    pub final_val_bpb: Option<f64>,
    /// The same for the failure-free run (same manifest and seed).
    pub baseline_val_bpb: Option<f64>,
    pub baseline_goodput: Option<f64>,
    pub baseline_uptime: Option<f64>,
    pub kills: usize,
    pub restarts: usize,
    pub pauses: usize,
    /// Restarted processes whose deltas were merged after their restart.
    pub rejoined: usize,
    /// Peer processes that exited with an error (or a signal the harness did not send).
    pub abnormal_exits: usize,
    /// Checkpoints that did not load when a killed peer was restarted or at the end.
    pub unreadable_checkpoints: usize,
    /// Every peer of the chaos run ended with the same anchor hashes.
    pub anchors_agree: bool,
    pub consensus_distance: Option<f64>,
    pub tokens_computed: u64,
    pub peers: u32,
    pub duration_s: u64,
    pub mtbf_s: u64,
    pub seed: u64,
    pub wall_s: f64,
    pub faults: Vec<Fault>,
}

/// What one swarm run (baseline or chaos) yields.
#[derive(Debug, Default)]
struct Outcome {
    goodput: f64,
    uptime: f64,
    final_val_bpb: Option<f64>,
    kills: usize,
    restarts: usize,
    pauses: usize,
    rejoined: usize,
    abnormal_exits: usize,
    unreadable_checkpoints: usize,
    anchors_agree: bool,
    consensus_distance: Option<f64>,
    tokens_computed: u64,
}

pub fn main(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    prepare(&args.run_dir)?;
    let corpus = super::train::load_corpus(args.data.as_deref())?;
    let manifest = swarm::manifest(args.config.as_deref(), args.seed, None, &corpus)?;
    let period_ms = manifest.validate()?.period_ms();
    let duration_ms = args.duration * 1000;
    let faults = chaos::schedule(&ScheduleConfig {
        peers: args.peers as usize,
        duration_ms,
        mtbf_ms: args.mtbf * 1000,
        downtime_ms: (args.downtime * 500, args.downtime * 1500),
        pause_ms: (args.pause * 500, args.pause * 1500),
        kill_share: args.kill_share,
        warmup_ms: (duration_ms / 10).max(2 * period_ms),
        settle_ms: (duration_ms / 5).max(3 * period_ms),
        seed: args.seed,
    });
    let kills = faults.iter().filter(|f| matches!(f.kind, FaultKind::Kill { .. })).count();
    println!(
        "chaos: {} peers × {} s, {} faults ({kills} kills, {} pauses), seed {}, in {}",
        args.peers,
        args.duration,
        faults.len(),
        faults.len() - kills,
        args.seed,
        args.run_dir.display()
    );
    let baseline = if args.no_baseline {
        None
    } else {
        println!("baseline: the same swarm without failures");
        Some(run_swarm(&args, &args.run_dir.join("baseline"), manifest.clone(), &[])?)
    };
    println!("chaos run");
    let run = run_swarm(&args, &args.run_dir.join("chaos"), manifest, &faults)?;
    let report = Report {
        goodput: run.goodput,
        uptime: run.uptime,
        final_val_bpb: run.final_val_bpb,
        baseline_val_bpb: baseline.as_ref().and_then(|b| b.final_val_bpb),
        baseline_goodput: baseline.as_ref().map(|b| b.goodput),
        baseline_uptime: baseline.as_ref().map(|b| b.uptime),
        kills: run.kills,
        restarts: run.restarts,
        pauses: run.pauses,
        rejoined: run.rejoined,
        abnormal_exits: run.abnormal_exits + baseline.as_ref().map_or(0, |b| b.abnormal_exits),
        unreadable_checkpoints: run.unreadable_checkpoints,
        anchors_agree: run.anchors_agree,
        consensus_distance: run.consensus_distance,
        tokens_computed: run.tokens_computed,
        peers: args.peers,
        duration_s: args.duration,
        mtbf_s: args.mtbf,
        seed: args.seed,
        wall_s: started.elapsed().as_secs_f64(),
        faults,
    };
    print_report(&report);
    let path = args.run_dir.join(REPORT_FILE);
    atoll::checkpoint::write_atomic(&path, &serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("report written to {}", path.display());
    if report.abnormal_exits > 0 || report.unreadable_checkpoints > 0 || !report.anchors_agree {
        bail!("the swarm did not come through intact (see {})", path.display());
    }
    Ok(())
}

/// Creates the run dir; an earlier chaos run there is replaced, anything else refused.
fn prepare(dir: &Path) -> anyhow::Result<()> {
    const OURS: [&str; 3] = ["baseline", "chaos", REPORT_FILE];
    if dir.exists() {
        for e in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !OURS.contains(&name.as_str()) {
                bail!(
                    "{} holds {name}, so it is not a chaos directory; give another --run-dir",
                    dir.display()
                );
            }
        }
        for name in OURS {
            let path = dir.join(name);
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else if path.exists() {
                std::fs::remove_file(&path)
            } else {
                Ok(())
            };
            removed.with_context(|| format!("cannot remove {}", path.display()))?;
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))
}

/// One peer's slot in the swarm.
enum Slot {
    Up { child: Child },
    Paused { child: Child, until_ms: u64 },
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
    bars: Vec<ProgressBar>,
    multi: MultiProgress,
    window: Instant,
    window_unix_ms: u64,
    out: Outcome,
}

fn run_swarm(
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
        bars: Vec::new(),
        multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
        window: Instant::now(),
        window_unix_ms: status::unix_ms(),
        out: Outcome::default(),
    };
    let result = s.drive(faults);
    for slot in &mut s.slots {
        if let Slot::Up { child } | Slot::Paused { child, .. } = slot {
            let _ = Command::new("kill").args(["-CONT", &child.id().to_string()]).status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    s.multi.clear().ok();
    result?;
    let dirs: Vec<PathBuf> = (0..args.peers).map(|i| swarm::peer_dir(dir, i)).collect();
    let mut merges = Vec::new();
    let mut finals = Vec::new();
    let mut hashes = Vec::new();
    for d in &dirs {
        merges.extend(ledger::read(d).with_context(|| format!("cannot read {}", d.display()))?);
        let st = status::read(&d.join(status::FILE_NAME))
            .with_context(|| format!("cannot read the status of {}", d.display()))?;
        let t = st.training.unwrap_or_default();
        finals.extend(t.final_val_bpb);
        hashes.push(t.anchor_hashes);
        if let Err(e) = atoll::checkpoint::load(&atoll::checkpoint::path_in(d)) {
            tracing::error!(dir = %d.display(), error = %e, "final checkpoint does not load");
            s.out.unreadable_checkpoints += 1;
        }
    }
    let mut out = s.out;
    let window_end = s.window_unix_ms + args.duration * 1000;
    out.goodput = chaos::goodput(&s.lives, &merges, settings.raw().fragments);
    // Periods count from the swarm's first merge: starting the processes is not downtime.
    let first = merges.iter().map(|m| m.unix_ms).min().unwrap_or(s.window_unix_ms);
    out.uptime = chaos::uptime(&merges, first, window_end, settings.period_ms());
    out.rejoined = chaos::rejoined(&s.lives, &merges);
    out.tokens_computed = s.lives.iter().map(Incarnation::computed).sum();
    out.final_val_bpb = (finals.len() == dirs.len() && !finals.is_empty())
        .then(|| finals.iter().sum::<f64>() / finals.len() as f64);
    out.anchors_agree = hashes.windows(2).all(|w| w[0] == w[1]);
    out.consensus_distance = swarm::consensus(&manifest, dirs.iter().map(PathBuf::as_path)).ok();
    println!(
        "  goodput {:.3}, uptime {:.3}, final val_bpb {}, anchors {}",
        out.goodput,
        out.uptime,
        out.final_val_bpb.map_or("-".into(), |v| format!("{v:.3}")),
        if out.anchors_agree { "identical" } else { "DIFFER" }
    );
    Ok(out)
}

impl Swarm<'_> {
    fn elapsed_ms(&self) -> u64 {
        self.window.elapsed().as_millis() as u64
    }

    fn say(&self, msg: String) {
        let line = format!("[{:>5.1} s] {msg}", self.elapsed_ms() as f64 / 1000.0);
        if swarm::console_is_terminal() {
            self.multi.println(line).ok();
        } else {
            println!("{line}");
        }
    }

    /// Starts peer `i` (training until the window ends) and records a new life.
    fn launch(&mut self, i: u32, bootstrap: &[String], restart: bool) -> anyhow::Result<Child> {
        let left_ms = (self.args.duration * 1000).saturating_sub(self.elapsed_ms());
        let child = swarm::spawn(&swarm::Launch {
            dir: swarm::peer_dir(self.dir, i),
            manifest: &self.manifest,
            index: i,
            peers: self.args.peers,
            until: swarm::Until::Seconds(left_ms.div_ceil(1000).max(1)),
            backend: self.args.backend,
            data: self.args.data.as_deref(),
            bootstrap,
        })?;
        self.lives.push(Incarnation {
            peer: i as usize,
            proto_id: String::new(),
            started_unix_ms: status::unix_ms(),
            tokens_at_start: 0,
            tokens_last: 0,
            restart,
        });
        Ok(child)
    }

    fn drive(&mut self, faults: &[Fault]) -> anyhow::Result<()> {
        let n = self.args.peers;
        let mut first = self.launch(0, &[], false)?;
        let addr = swarm::listen_addr(
            &swarm::peer_dir(self.dir, 0),
            &mut first,
            0,
            Duration::from_secs(60),
        )?;
        self.slots.push(Slot::Up { child: first });
        self.current.push(0);
        for i in 1..n {
            let child = self.launch(i, std::slice::from_ref(&addr), false)?;
            self.slots.push(Slot::Up { child });
            self.current.push(self.lives.len() - 1);
        }
        self.window = Instant::now();
        self.window_unix_ms = status::unix_ms();
        for i in 0..n {
            self.bars.push(swarm::bar(&self.multi, &i.to_string(), 0));
        }
        let window_ms = self.args.duration * 1000;
        // Finishing takes a few quiet periods; a swarm that has not ended by then is stuck.
        let give_up = Duration::from_millis(window_ms) + Duration::from_secs(300);
        let mut pending = faults.iter().peekable();
        let mut last_plain = Instant::now();
        loop {
            let now = self.elapsed_ms();
            while let Some(f) = pending.next_if(|f| f.at_ms <= now) {
                self.inject(f)?;
            }
            for i in 0..n as usize {
                self.tend(i, now)?;
            }
            self.observe(last_plain.elapsed() >= PLAIN_EVERY && !swarm::console_is_terminal());
            if last_plain.elapsed() >= PLAIN_EVERY {
                last_plain = Instant::now();
            }
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
        let slot = std::mem::replace(&mut self.slots[f.peer], Slot::Exited);
        let Slot::Up { mut child } = slot else {
            self.say(format!("peer {} is not running; fault at {} ms skipped", f.peer, f.at_ms));
            self.slots[f.peer] = slot;
            return Ok(());
        };
        self.slots[f.peer] = match f.kind {
            FaultKind::Kill { down_ms } => {
                child.kill().context("cannot kill a peer")?;
                child.wait()?;
                self.out.kills += 1;
                self.say(format!("kill peer {} (down {:.1} s)", f.peer, down_ms as f64 / 1000.0));
                Slot::Down { restart_ms: f.at_ms + down_ms }
            }
            FaultKind::Pause { for_ms } => {
                signal(&child, "-STOP")?;
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
                signal(&child, "-CONT")?;
                self.say(format!("resume peer {i}"));
                Slot::Up { child }
            }
            Slot::Up { mut child } => match child.try_wait()? {
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
                    if s.pid == child.id() {
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
    fn observe(&mut self, plain: bool) {
        for (i, slot) in self.slots.iter().enumerate() {
            let dir = swarm::peer_dir(self.dir, i as u32);
            let (pid, state) = match slot {
                Slot::Up { child } => (Some(child.id()), ""),
                Slot::Paused { child, .. } => (Some(child.id()), "paused "),
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
            let line = swarm::live_line(&dir).map(|(_, msg)| msg).unwrap_or_default();
            self.bars[i].set_message(format!("{state}{line}"));
            if plain {
                println!("peer {i} {state}{line}");
            }
        }
    }
}

/// Sends a signal (`-STOP`, `-CONT`) to a peer process.
fn signal(child: &Child, sig: &str) -> anyhow::Result<()> {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .context("cannot run kill")?
        .success();
    if !ok {
        bail!("kill {sig} {} failed", child.id());
    }
    Ok(())
}

fn print_report(r: &Report) {
    let bpb = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3}"));
    println!();
    println!(
        "chaos: goodput {:.3}, uptime {:.3}; final val_bpb {} vs {} without failures",
        r.goodput,
        r.uptime,
        bpb(r.final_val_bpb),
        bpb(r.baseline_val_bpb)
    );
    println!(
        "{} kills, {} restarts ({} rejoined), {} pauses; {} abnormal exits, {} unreadable \
         checkpoints; anchors {}; {:.0} s",
        r.kills,
        r.restarts,
        r.rejoined,
        r.pauses,
        r.abnormal_exits,
        r.unreadable_checkpoints,
        if r.anchors_agree { "identical" } else { "DIFFER" },
        r.wall_s
    );
}
