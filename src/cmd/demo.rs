//! `atoll demo`: a local swarm. Starts N `atoll run` processes on loopback, each training
//! its own shard of the embedded corpus and merging with the others, shows one live line
//! per peer, and ends with a summary table and `RUN_DIR/summary.json`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use atoll::backend::Backend;
use atoll::fragment::FragmentPlan;
use atoll::manifest::{self, Manifest};
use atoll::node::anchors;
use atoll::node::status::{self, StatusFile};
use atoll::train::TrainConfig;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

/// Name of the summary file in the demo's run dir.
pub const SUMMARY_FILE: &str = "summary.json";
/// The swarm name of demo runs.
const DEMO_NAME: &str = "atoll-demo";
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
    /// Train on this UTF-8 text file or directory instead of the embedded corpus.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Run seed: initial weights and data shuffle.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Use this run manifest instead of the default one (its `epoch_unix_ms` is reset).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// CPU backend of every peer.
    #[arg(long, default_value = "flex")]
    pub backend: Backend,
    /// Give up (and stop the peers) after this many seconds.
    #[arg(long, default_value_t = 1200)]
    pub timeout: u64,
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
    pub steps: u64,
    /// What synchronous data-parallel would send per peer for the same steps
    /// (2 × parameters × 4 bytes per step), and the ratio to what a peer sent.
    pub data_parallel_bytes_per_peer: u64,
    pub bytes_ratio_vs_data_parallel: f64,
    pub manifest_id: String,
}

struct Peer {
    dir: PathBuf,
    child: Child,
    bar: ProgressBar,
    exit: Option<std::process::ExitStatus>,
}

pub fn main(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    prepare_dir(&args.run_dir)?;
    let corpus = super::train::load_corpus(args.data.as_deref())?;
    let mut manifest = match &args.config {
        Some(path) => Manifest::load(path)?,
        None => {
            let mut train = TrainConfig { seed: args.seed, ..TrainConfig::default() };
            train.schedule.decay_steps = args.steps.max(1);
            Manifest::new(DEMO_NAME, train, &corpus, manifest::default_protocol())
        }
    };
    manifest.epoch_unix_ms = status::unix_ms();
    manifest.validate()?;
    manifest.check_corpus(&corpus)?;
    let manifest_path = args.run_dir.join(manifest::FILE_NAME);
    atoll::checkpoint::write_atomic(&manifest_path, &manifest.to_bytes())
        .with_context(|| format!("cannot write {}", manifest_path.display()))?;
    println!(
        "demo: {} peers × {} steps, manifest {} in {}",
        args.peers,
        args.steps,
        manifest.run_id(),
        args.run_dir.display()
    );

    let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
    let mut peers: Vec<Peer> = Vec::new();
    let result = run_swarm(&args, &manifest_path, &multi, &mut peers);
    if result.is_err() {
        for p in &mut peers {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
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

/// Creates the demo dir, removing peer dirs and the summary of an earlier demo. A
/// non-empty directory that is not a demo's is refused.
fn prepare_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        let is_demo = dir.join(manifest::FILE_NAME).exists();
        let entries: Vec<_> = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read {}", dir.display()))?
            .filter_map(Result::ok)
            .collect();
        if !is_demo && !entries.is_empty() {
            bail!("{} exists and is not a demo directory; give another --run-dir", dir.display());
        }
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("peer-") {
                std::fs::remove_dir_all(e.path())
                    .with_context(|| format!("cannot remove {}", e.path().display()))?;
            }
        }
        let _ = std::fs::remove_file(dir.join(SUMMARY_FILE));
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))
}

fn spawn_peer(
    args: &Args,
    manifest: &Path,
    index: u32,
    bootstrap: Option<&str>,
) -> anyhow::Result<(PathBuf, Child)> {
    let dir = args.run_dir.join(format!("peer-{index}"));
    std::fs::create_dir_all(&dir)?;
    let log = std::fs::File::create(dir.join("peer.log"))?;
    let exe = std::env::current_exe().context("cannot find the atoll executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("run")
        .arg("--run-dir")
        .arg(&dir)
        .arg("--config")
        .arg(manifest)
        .args(["--shard", &format!("{index}/{}", args.peers)])
        .args(["--steps", &args.steps.to_string()])
        .args(["--listen", "/ip4/127.0.0.1/tcp/0", "--no-mdns"])
        .args(["--backend", args.backend.name()]);
    if let Some(data) = &args.data {
        cmd.arg("--data").arg(data);
    }
    if let Some(b) = bootstrap {
        cmd.args(["--bootstrap", b]);
    }
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("cannot start a peer process")?;
    Ok((dir, child))
}

fn bar(multi: &MultiProgress, index: u32, steps: u64) -> ProgressBar {
    let bar = multi.add(ProgressBar::new(steps));
    let style = ProgressStyle::with_template("peer {prefix} [{bar:20}] {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(index.to_string());
    bar
}

fn run_swarm(
    args: &Args,
    manifest: &Path,
    multi: &MultiProgress,
    peers: &mut Vec<Peer>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let (dir0, child0) = spawn_peer(args, manifest, 0, None)?;
    peers.push(Peer {
        dir: dir0.clone(),
        child: child0,
        bar: bar(multi, 0, args.steps),
        exit: None,
    });
    // The first peer's address is the others' bootstrap.
    let addr = loop {
        if let Ok(s) = status::read(&dir0.join(status::FILE_NAME)) {
            if let Some(a) = s.stats.listen_addrs.iter().find(|a| a.contains("/tcp/")) {
                break a.clone();
            }
        }
        if let Some(exit) = peers[0].child.try_wait()? {
            bail!("peer 0 exited ({exit}) before listening:\n{}", log_tail(&dir0));
        }
        if Instant::now() > deadline.min(Instant::now() + Duration::from_secs(60)) {
            bail!("peer 0 did not start listening:\n{}", log_tail(&dir0));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for i in 1..args.peers {
        let (dir, child) = spawn_peer(args, manifest, i, Some(&addr))?;
        peers.push(Peer { dir, child, bar: bar(multi, i, args.steps), exit: None });
    }
    let plain = !console_is_terminal();
    let mut last_plain = Instant::now();
    loop {
        let mut running = 0;
        for (i, p) in peers.iter_mut().enumerate() {
            if p.exit.is_none() {
                p.exit = p.child.try_wait()?;
                if let Some(exit) = p.exit.filter(|e| !e.success()) {
                    bail!("peer {i} failed ({exit}):\n{}", log_tail(&p.dir));
                }
            }
            running += usize::from(p.exit.is_none());
            let line = live_line(&p.dir);
            if let Some((step, msg)) = line {
                p.bar.set_position(step);
                p.bar.set_message(msg);
            }
        }
        if plain && last_plain.elapsed() >= PLAIN_EVERY {
            last_plain = Instant::now();
            for (i, p) in peers.iter().enumerate() {
                if let Some((step, msg)) = live_line(&p.dir) {
                    println!("peer {i} step {step}/{} {msg}", args.steps);
                }
            }
        }
        if running == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the demo did not finish within --timeout {} s", args.timeout);
        }
        std::thread::sleep(REFRESH);
    }
}

fn console_is_terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal()
}

/// `(step, "loss … round … peers … sent …")` from a peer's status file.
fn live_line(dir: &Path) -> Option<(u64, String)> {
    let s = status::read(&dir.join(status::FILE_NAME)).ok()?;
    let t = s.training.as_ref()?;
    let loss = t.loss.map_or("-".into(), |l| format!("{l:.3}"));
    let bpb = t.val_bpb.map_or("-".into(), |v| format!("{v:.3}"));
    let round = t.round.iter().max().copied().unwrap_or(0);
    let phase = match (t.final_val_bpb, t.trained) {
        (Some(_), _) => " done",
        (None, true) => " merging",
        _ => "",
    };
    Some((
        t.step,
        format!(
            "step {} loss {loss} val_bpb {bpb} round {round} peers {} sent {}{phase}",
            t.step,
            s.stats.run_peers.len(),
            super::status::bytes(s.stats.bytes_sent)
        ),
    ))
}

fn log_tail(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join("peer.log")).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

fn summarise(
    args: &Args,
    manifest: &Manifest,
    peers: &[Peer],
    wall_s: f64,
) -> anyhow::Result<Summary> {
    let mut out = Vec::new();
    let mut param_count = 0;
    for p in peers {
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
        });
    }
    let anchors_agree = out.windows(2).all(|w| w[0].anchor_hashes == w[1].anchor_hashes);
    let bpbs: Vec<f64> = out.iter().filter_map(|p| p.final_val_bpb).collect();
    let mean_final_val_bpb = (bpbs.len() == out.len() && !bpbs.is_empty())
        .then(|| bpbs.iter().sum::<f64>() / bpbs.len() as f64);
    let dp = 2 * param_count as u64 * 4 * args.steps;
    let max_sent = out.iter().map(|p| p.bytes_sent).max().unwrap_or(0).max(1);
    Ok(Summary {
        consensus_distance: consensus(manifest, peers)?,
        anchors_agree,
        mean_final_val_bpb,
        wall_s,
        param_count,
        steps: args.steps,
        data_parallel_bytes_per_peer: dp,
        bytes_ratio_vs_data_parallel: dp as f64 / max_sent as f64,
        manifest_id: manifest.run_id().short(),
        peers: out,
    })
}

/// Consensus distance of the peers' saved anchors, averaged over fragments.
fn consensus(manifest: &Manifest, peers: &[Peer]) -> anyhow::Result<f64> {
    let model = manifest.train.model.init(&Backend::Flex.device());
    let specs = atoll::model::params::tensor_specs(&model);
    let plan = FragmentPlan::new(&specs, manifest.protocol.fragments)?;
    let mut states = Vec::new();
    for p in peers {
        match anchors::load(&p.dir, &plan) {
            Ok(Some(s)) => states.push(s),
            Ok(None) => bail!("{} holds no anchors", p.dir.display()),
            Err(e) => bail!("{e}"),
        }
    }
    let mut total = 0.0;
    for f in 0..plan.len() {
        let anchors: Vec<&[f32]> = states.iter().map(|s| s[f].anchor.as_slice()).collect();
        total += atoll::proto::consensus_distance(&anchors);
    }
    Ok(total / plan.len().max(1) as f64)
}

fn print_summary(s: &Summary) {
    println!();
    println!(
        "{:<6} {:<54} {:>9} {:>10} {:>11} {:>11}",
        "peer", "peer id", "val_bpb", "tokens", "sent", "received"
    );
    for (i, p) in s.peers.iter().enumerate() {
        let bpb = p.final_val_bpb.map_or("-".into(), |v| format!("{v:.3}"));
        println!(
            "{:<6} {:<54} {:>9} {:>10} {:>11} {:>11}",
            i,
            p.peer_id,
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
