//! `atoll demo`: a local swarm. Starts N `atoll run` processes on loopback, each training
//! its own shard of the embedded corpus and merging with the others, shows one live line
//! per peer, and ends with a summary table and `RUN_DIR/summary.json`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use atoll::backend::Backend;
use atoll::fleet::{Process, Spec, Until};
use atoll::manifest::Manifest;
use atoll::rundir::status::{self, StatusFile};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget};
use serde::Serialize;

use super::swarm;

/// Name of the summary file in the demo's run dir.
pub const SUMMARY_FILE: &str = "summary.json";
/// How often the live lines are refreshed.
const REFRESH: Duration = Duration::from_millis(500);
/// Without a terminal, a plain progress line per peer this often.
const PLAIN_EVERY: Duration = Duration::from_secs(15);

/// Arguments of `atoll demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Number of peer processes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub peers: u32,
    /// Inner steps per peer.
    #[arg(long, default_value_t = 300)]
    pub steps: u64,
    /// Directory of the demo: manifest, one run dir per peer (`peer-I`), summary.json.
    /// Peer dirs of an earlier demo there are replaced.
    #[arg(long, default_value = "runs/demo")]
    pub run_dir: PathBuf,
    #[command(flatten)]
    pub run: swarm::RunArgs,
    #[command(flatten)]
    pub pace: swarm::Pace,
    /// Give up (and stop the peers) after this many seconds.
    #[arg(long, default_value_t = 1200)]
    pub timeout: u64,
    /// What the peers run: atoll, or a synchronous baseline on the same manifest, shards
    /// and network for comparison (`dp`: data-parallel, `diloco`: synchronous DiLoCo).
    #[arg(long, value_enum, default_value_t = super::run::Method::Atoll)]
    pub method: super::run::Method,
    /// Cap every peer's uploads of payloads at this many megabits per second (a slow link).
    #[arg(long, value_name = "MBPS")]
    pub max_upload_mbps: Option<f64>,
    /// Train for this many seconds instead of --steps (which still sets the default
    /// manifest's learning-rate decay): peers of different speeds stop together.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub duration: Option<u64>,
    /// Emulate slower hardware on some peers (`atoll run --slowdown F`): their inner steps
    /// take F times their compute time. F from 1 to 1000.
    #[arg(long, value_name = "F", default_value = "1")]
    pub slowdown: atoll::node::Slowdown,
    /// How many peers get --slowdown: the last N of --peers. Default: every peer, late
    /// ones included (a swarm of slow machines that fits on few cores).
    #[arg(long, value_name = "N")]
    pub slow_peers: Option<u32>,
    /// Scavenging: start this many more peers --late-after seconds into the run (each with
    /// its own shard; with --duration they stop with the others).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub late_peers: u32,
    /// Seconds after the first peer started when the --late-peers start.
    #[arg(long, value_name = "SECS")]
    pub late_after: Option<u64>,
    /// A mixed swarm: the peers' backends in turn (peer I gets the I-th, cycling), e.g.
    /// `wgpu,flex`. Overrides --backend.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub backends: Vec<Backend>,
}

impl Args {
    /// Refuses combinations that would silently do something else than asked.
    fn check(&self) -> anyhow::Result<()> {
        let atoll = self.method == super::run::Method::Atoll;
        let slowed = self.slowdown != atoll::node::Slowdown::NONE;
        if let Some(n) = self.slow_peers {
            if !slowed {
                bail!("--slow-peers {n} needs --slowdown F with F > 1");
            }
            if n > self.peers {
                bail!("--slow-peers {n} is more than --peers {}", self.peers);
            }
        }
        if self.peers + self.late_peers > 16 {
            bail!("--peers plus --late-peers is at most 16");
        }
        match (self.late_peers, self.late_after, self.duration) {
            (0, Some(_), _) => bail!("--late-after needs --late-peers N"),
            (1.., None, _) => bail!("--late-peers needs --late-after SECS"),
            (1.., Some(a), Some(d)) if a >= d => {
                bail!("--late-after {a} must be less than --duration {d}")
            }
            _ => {}
        }
        if !atoll && (slowed || self.late_peers > 0) {
            bail!("--slowdown and --late-peers run atoll peers, not --method dp|diloco");
        }
        Ok(())
    }

    /// Whether peer `index` runs with `--slowdown`.
    fn slowed(&self, index: u32) -> bool {
        match self.slow_peers {
            None => true,
            Some(n) => index < self.peers && index + n >= self.peers,
        }
    }

    /// The backend of peer `index`.
    fn backend(&self, index: u32) -> Backend {
        match self.backends.len() {
            0 => self.run.backend,
            n => self.backends[index as usize % n],
        }
    }

    /// When peer `index` starts, counted from the first peer's start.
    fn start_after(&self, index: u32) -> u64 {
        if index < self.peers {
            0
        } else {
            self.late_after.unwrap_or(0)
        }
    }
}

/// One peer in `summary.json`.
#[derive(Debug, Serialize)]
pub struct PeerSummary {
    pub peer_id: String,
    pub final_val_loss: Option<f64>,
    pub final_val_bpb: Option<f64>,
    pub tokens: u64,
    pub steps: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub anchor_hashes: Vec<String>,
    /// Its `--slowdown` factor (1: full speed).
    pub slowdown: f64,
    /// Seconds after the first peer it started (0 but for `--late-peers`).
    pub started_after_s: u64,
    /// The backend it trained on.
    pub backend: Backend,
}

/// `summary.json`.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub peers: Vec<PeerSummary>,
    /// Mean over fragments of the peers' relative spread around the mean anchor (0 = equal).
    pub consensus_distance: f64,
    /// Every peer ended with the same anchor hash for every fragment.
    pub anchors_agree: bool,
    pub mean_final_val_bpb: Option<f64>,
    pub wall_s: f64,
    pub param_count: usize,
    /// Most inner steps one peer took.
    pub steps: u64,
    /// What synchronous data-parallel would send per peer for the same steps
    /// (2 × parameters × 4 bytes per step), and the ratio to what a peer sent.
    pub data_parallel_bytes_per_peer: u64,
    pub bytes_ratio_vs_data_parallel: f64,
    pub manifest_id: String,
}

struct Peer {
    dir: PathBuf,
    process: Process,
    bar: ProgressBar,
}

pub fn main(args: Args) -> anyhow::Result<()> {
    args.check()?;
    let started = Instant::now();
    swarm::prepare_dir(&args.run_dir, &[SUMMARY_FILE])?;
    let (_, manifest) = args.run.open(Some(args.steps))?;
    atoll::model::preset::check_machine(&manifest.train, u64::from(args.peers))?;
    let manifest_path = swarm::save_manifest(&args.run_dir, &manifest)?;
    let length = match args.duration {
        Some(d) => format!("{d} s"),
        None => format!("{} steps", args.steps),
    };
    let gpu = (0..args.peers).filter(|&i| args.backend(i).is_gpu()).count() as u32;
    if args.duration.is_none() && gpu > 0 && gpu < args.peers {
        // A GPU peer does its steps many times faster and leaves the run with the anchors
        // of that moment, while the CPU peers merge on (bench/RESULTS.md, GPU backend).
        eprintln!(
            "note: GPU and CPU peers given a step count finish far apart, and a peer that \
             leaves early keeps the anchors of when it left; --duration SECS makes them \
             train as long and stop together"
        );
    }
    println!(
        "demo: {} {} peers × {length}, manifest {} in {}",
        args.peers,
        args.method.name(),
        manifest.run_id(),
        args.run_dir.display()
    );
    if args.slowdown != atoll::node::Slowdown::NONE {
        let slow = (0..args.peers + args.late_peers).filter(|&i| args.slowed(i)).count();
        println!("demo: {slow} peers slowed {}× (--slowdown)", args.slowdown);
    }
    if let (1.., Some(after)) = (args.late_peers, args.late_after) {
        println!("demo: {} more peers after {after} s (--late-peers)", args.late_peers);
    }

    let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
    let mut peers: Vec<Peer> = Vec::new();
    let result = run_swarm(&args, &manifest_path, &multi, &mut peers);
    if result.is_err() {
        // Dropping a process kills it.
        peers.clear();
    }
    result?;
    multi.clear().ok();
    let summary = summarise(&args, &manifest, &peers, started.elapsed().as_secs_f64())?;
    print_summary(&summary);
    let path = args.run_dir.join(SUMMARY_FILE);
    atoll::checkpoint::write_atomic(&path, &serde_json::to_vec_pretty(&summary)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("summary written to {}", path.display());
    if !summary.anchors_agree {
        bail!("the peers ended with different anchors (see {})", path.display());
    }
    Ok(())
}

fn start_peer(
    args: &Args,
    manifest: &Path,
    index: u32,
    bootstrap: &[String],
    multi: &MultiProgress,
) -> anyhow::Result<Peer> {
    let dir = swarm::peer_dir(&args.run_dir, index);
    let shard = format!("{index}/{}", args.peers + args.late_peers);
    let until = match args.duration {
        // A late peer stops with the others.
        Some(d) => Until::Seconds(d.saturating_sub(args.start_after(index)).max(1)),
        None => Until::Steps(args.steps),
    };
    let spec = Spec::train(dir.clone(), manifest, &shard, until)
        .bootstrap(bootstrap.iter().cloned())
        .backend(args.backend(index))
        .data(args.run.data.as_deref());
    let mut spec = args.pace.apply(spec);
    if let Some(mbps) = args.max_upload_mbps {
        spec = spec.arg("--max-upload-mbps").arg(&mbps.to_string());
    }
    if args.slowed(index) && args.slowdown != atoll::node::Slowdown::NONE {
        spec = spec.arg("--slowdown").arg(&args.slowdown.factor().to_string());
    }
    if args.method != super::run::Method::Atoll {
        let group = args.peers.to_string();
        spec = spec.arg("--method").arg(args.method.name()).arg("--group").arg(&group);
    }
    let process = swarm::start(&spec)?;
    let bar = swarm::bar(multi, &index.to_string(), spec.steps().unwrap_or(0));
    Ok(Peer { dir, process, bar })
}

fn run_swarm(
    args: &Args,
    manifest: &Path,
    multi: &MultiProgress,
    peers: &mut Vec<Peer>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    peers.push(start_peer(args, manifest, 0, &[], multi)?);
    // The first peer's address is the others' bootstrap.
    let first = &mut peers[0];
    let addr = swarm::listen_addr(&first.dir, &mut first.process, 0, Duration::from_secs(60))?;
    if let Ok(a) = addr.parse() {
        let run = Manifest::load(manifest)?.run_id();
        if let Some(line) = atoll::join::join_line(run, &[a]) {
            // Above the live lines (indicatif keeps them below what it prints).
            let text = format!("others on this machine join with: {line}");
            if swarm::console_is_terminal() {
                multi.println(text).ok();
            } else {
                println!("{text}");
            }
        }
    }
    for i in 1..args.peers {
        peers.push(start_peer(args, manifest, i, std::slice::from_ref(&addr), multi)?);
    }
    let first_started = Instant::now();
    let plain = !swarm::console_is_terminal();
    let mut last_plain = Instant::now();
    loop {
        let mut running = 0;
        for (i, p) in peers.iter_mut().enumerate() {
            let exit = p.process.poll_exit()?;
            if let Some(exit) = exit.filter(|e| !e.success()) {
                bail!("peer {i} failed ({exit}):\n{}", swarm::log_tail(&p.dir));
            }
            running += usize::from(exit.is_none());
            if let Some((step, msg)) = swarm::live_line(&p.dir) {
                p.bar.set_position(step);
                p.bar.set_message(msg);
            }
        }
        if plain && last_plain.elapsed() >= PLAIN_EVERY {
            last_plain = Instant::now();
            for (i, p) in peers.iter().enumerate() {
                if let Some((step, msg)) = swarm::live_line(&p.dir) {
                    println!("peer {i} step {step}/{} {msg}", args.steps);
                }
            }
        }
        let next = peers.len() as u32;
        let late = next < args.peers + args.late_peers;
        if late && first_started.elapsed().as_secs() >= args.start_after(next) {
            peers.push(start_peer(args, manifest, next, std::slice::from_ref(&addr), multi)?);
            continue;
        }
        if running == 0 && !late {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the demo did not finish within --timeout {} s", args.timeout);
        }
        std::thread::sleep(REFRESH);
    }
}

fn summarise(
    args: &Args,
    manifest: &Manifest,
    peers: &[Peer],
    wall_s: f64,
) -> anyhow::Result<Summary> {
    let mut out = Vec::new();
    let mut param_count = 0;
    for (i, p) in peers.iter().enumerate() {
        let path = p.dir.join(status::FILE_NAME);
        let s: StatusFile =
            status::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let t = s.training.clone().unwrap_or_default();
        param_count = t.param_count;
        out.push(PeerSummary {
            peer_id: s.stats.peer_id.clone(),
            final_val_loss: t.final_val_loss,
            final_val_bpb: t.final_val_bpb,
            tokens: t.tokens,
            steps: t.step,
            bytes_sent: s.stats.bytes_sent,
            bytes_received: s.stats.bytes_received,
            anchor_hashes: t.anchor_hashes,
            slowdown: if args.slowed(i as u32) { args.slowdown.factor() } else { 1.0 },
            started_after_s: args.start_after(i as u32),
            backend: args.backend(i as u32),
        });
    }
    let anchors_agree = out.windows(2).all(|w| w[0].anchor_hashes == w[1].anchor_hashes);
    let bpbs: Vec<f64> = out.iter().filter_map(|p| p.final_val_bpb).collect();
    let mean_final_val_bpb = (bpbs.len() == out.len() && !bpbs.is_empty())
        .then(|| bpbs.iter().sum::<f64>() / bpbs.len() as f64);
    let steps = out.iter().map(|p| p.steps).max().unwrap_or(0);
    let dp = 2 * param_count as u64 * 4 * steps;
    let max_sent = out.iter().map(|p| p.bytes_sent).max().unwrap_or(0).max(1);
    Ok(Summary {
        consensus_distance: swarm::consensus(manifest, peers.iter().map(|p| p.dir.as_path()))?,
        anchors_agree,
        mean_final_val_bpb,
        wall_s,
        param_count,
        steps,
        data_parallel_bytes_per_peer: dp,
        bytes_ratio_vs_data_parallel: dp as f64 / max_sent as f64,
        manifest_id: manifest.run_id().short(),
        peers: out,
    })
}

fn print_summary(s: &Summary) {
    println!();
    println!(
        "{:<6} {:<54} {:<8} {:>9} {:>10} {:>11} {:>11}",
        "peer", "peer id", "backend", "val_bpb", "tokens", "sent", "received"
    );
    for (i, p) in s.peers.iter().enumerate() {
        let bpb = p.final_val_bpb.map_or("-".into(), |v| format!("{v:.3}"));
        println!(
            "{:<6} {:<54} {:<8} {:>9} {:>10} {:>11} {:>11}",
            i,
            p.peer_id,
            p.backend.name(),
            bpb,
            p.tokens,
            super::status::bytes(p.bytes_sent),
            super::status::bytes(p.bytes_received)
        );
    }
    let mean = s.mean_final_val_bpb.map_or("-".into(), |v| format!("{v:.3}"));
    println!(
        "swarm: mean final val_bpb {mean}; anchors {}; consensus distance {:.2e}; {:.0} s; {} parameters",
        if s.anchors_agree { "identical" } else { "DIFFER" },
        s.consensus_distance,
        s.wall_s,
        s.param_count
    );
    println!(
        "bytes: at most {} sent per peer vs {} for synchronous data-parallel ({:.0}× less)",
        super::status::bytes(s.peers.iter().map(|p| p.bytes_sent).max().unwrap_or(0)),
        super::status::bytes(s.data_parallel_bytes_per_peer),
        s.bytes_ratio_vs_data_parallel
    );
}
