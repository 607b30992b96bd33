//! `atoll chaos`: a local swarm under a seeded fault schedule. Peers are killed (and
//! restarted on their run dirs after a downtime) and paused (SIGSTOP/SIGCONT) while they
//! train for `--duration` seconds; then the swarm finishes as usual (merge until quiet,
//! evaluate the final anchors). A failure-free run of the same manifest and seed comes
//! first as the baseline. The figures go to `RUN_DIR/chaos.json`.
//!
//! `--method dp|diloco` applies the same schedule to a synchronous baseline run as an
//! elastic group (`atoll run --method … --elastic`): a member that misses a barrier by
//! `--barrier-timeout` is dropped and the rest go on. A group cannot re-admit a member
//! (membership is fixed when it forms), so a killed member is not restarted: it stays out,
//! and what it would have trained is missing from the run. Killing the last member is
//! skipped (there would be nothing left to measure).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use atoll::chaos::{self, Fault, FaultKind, ScheduleConfig};
use serde::Serialize;

use super::swarm;

mod swarm_run;
use swarm_run::run_swarm;

/// Name of the report in the chaos run dir.
pub const REPORT_FILE: &str = "chaos.json";
const REFRESH: Duration = Duration::from_millis(100);

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
    /// What the peers run: the swarm (atoll), or a synchronous baseline as an elastic
    /// group under the same schedule: `dp` (data-parallel) or `diloco` (synchronous DiLoCo).
    #[arg(long, value_enum, default_value_t = Method::Swarm)]
    pub method: Method,
    /// With `--method dp|diloco`: seconds the group waits at a barrier for a silent member
    /// before it drops it.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub barrier_timeout: u64,
    #[command(flatten)]
    pub pace: swarm::Pace,
    #[command(flatten)]
    pub run: swarm::RunArgs,
    /// Skip the failure-free baseline run.
    #[arg(long)]
    pub no_baseline: bool,
}

/// What the peers of a chaos run run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Method {
    /// atoll's leaderless swarm (Decoupled DiLoCo).
    Swarm,
    /// Elastic synchronous data-parallel.
    Dp,
    /// Elastic synchronous DiLoCo.
    Diloco,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Swarm => "swarm",
            Method::Dp => "dp",
            Method::Diloco => "diloco",
        }
    }

    /// A synchronous group: fixed membership, killed members stay out.
    pub fn is_group(self) -> bool {
        self != Method::Swarm
    }
}

/// `chaos.json`.
#[derive(Debug, Serialize)]
pub struct Report {
    pub method: &'static str,
    /// Tokens that reached the shared model (a merged anchor, or a mean of the group) ÷
    /// tokens computed, in the chaos run.
    pub goodput: f64,
    /// Tokens that reached the shared model in the chaos run ÷ the same in the failure-free
    /// run: what the failures cost, lost work and waiting together.
    pub goodput_vs_failure_free: Option<f64>,
    pub useful_tokens: u64,
    pub baseline_useful_tokens: Option<u64>,
    /// Share of protocol periods of the training window (from the first merge on) with at
    /// least one merge.
    pub uptime: f64,
    /// Mean final `val_bpb` of the peers (final anchors) in the chaos run; for a group, of
    /// the members that trained to the end (killed and evicted ones have no final model).
    pub final_val_bpb: Option<f64>,
    /// Peers that ended with a final model (all of them for the swarm).
    pub finished: usize,
    /// The same for the failure-free run (same manifest and seed).
    pub baseline_val_bpb: Option<f64>,
    pub baseline_goodput: Option<f64>,
    pub baseline_uptime: Option<f64>,
    pub kills: usize,
    pub restarts: usize,
    pub pauses: usize,
    /// Faults of the schedule not applied: the peer was not running (killed before, out
    /// of the group), or it was the group's last member.
    pub skipped_faults: usize,
    /// Restarted processes whose deltas were merged after their restart.
    pub rejoined: usize,
    /// Peer processes that exited with an error (or a signal the harness did not send).
    pub abnormal_exits: usize,
    /// Checkpoints that did not load when a killed peer was restarted or at the end.
    pub unreadable_checkpoints: usize,
    /// Every peer of the chaos run that finished ended with the same anchor hashes (a
    /// group's: the same parameters).
    pub anchors_agree: bool,
    pub consensus_distance: Option<f64>,
    pub tokens_computed: u64,
    pub peers: u32,
    pub duration_s: u64,
    pub mtbf_s: u64,
    /// `--barrier-timeout` of a group (none for the swarm).
    pub barrier_timeout_s: Option<u64>,
    /// `--min-step-ms`: every peer's fixed step rate, if set.
    pub min_step_ms: Option<u64>,
    pub seed: u64,
    pub wall_s: f64,
    pub faults: Vec<Fault>,
}

/// What one swarm run (baseline or chaos) yields.
#[derive(Debug, Default)]
struct Outcome {
    goodput: f64,
    useful_tokens: u64,
    uptime: f64,
    final_val_bpb: Option<f64>,
    finished: usize,
    skipped_faults: usize,
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

pub fn main(mut args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    prepare(&args.run_dir)?;
    let (_, manifest) = args.run.open(None)?;
    args.run.fit(&manifest, args.peers)?;
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
        seed: args.run.seed,
    });
    let kills = faults.iter().filter(|f| matches!(f.kind, FaultKind::Kill { .. })).count();
    println!(
        "chaos: {} {} peers × {} s, {} faults ({kills} kills, {} pauses), seed {}, in {}",
        args.method.name(),
        args.peers,
        args.duration,
        faults.len(),
        faults.len() - kills,
        args.run.seed,
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
    let baseline_useful = baseline.as_ref().map(|b| b.useful_tokens);
    let report = Report {
        method: args.method.name(),
        goodput: run.goodput,
        goodput_vs_failure_free: baseline_useful
            .filter(|&b| b > 0)
            .map(|b| run.useful_tokens as f64 / b as f64),
        useful_tokens: run.useful_tokens,
        baseline_useful_tokens: baseline_useful,
        uptime: run.uptime,
        final_val_bpb: run.final_val_bpb,
        finished: run.finished,
        skipped_faults: run.skipped_faults,
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
        barrier_timeout_s: args.method.is_group().then_some(args.barrier_timeout),
        min_step_ms: args.pace.min_step_ms,
        seed: args.run.seed,
        wall_s: started.elapsed().as_secs_f64(),
        faults,
    };
    print_report(&report);
    let path = args.run_dir.join(REPORT_FILE);
    atoll::checkpoint::write_atomic(&path, &serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("report written to {}", path.display());
    // A group whose finishers differ is the baseline's own weakness (a buffer that reached
    // some members only), reported, not a failure of the harness.
    let split = !report.anchors_agree && !args.method.is_group();
    if report.abnormal_exits > 0 || report.unreadable_checkpoints > 0 || split {
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

fn print_report(r: &Report) {
    let bpb = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3}"));
    println!();
    let vs = r.goodput_vs_failure_free.map_or("-".into(), |v| format!("{v:.3}"));
    println!(
        "chaos ({}): goodput {:.3} of computed, {vs} of the failure-free run's useful tokens; \
         uptime {:.3}; final val_bpb {} vs {} without failures",
        r.method,
        r.goodput,
        r.uptime,
        bpb(r.final_val_bpb),
        bpb(r.baseline_val_bpb)
    );
    println!(
        "{} kills, {} restarts ({} rejoined), {} pauses, {} faults skipped; {} of {} peers \
         finished; {} abnormal exits, {} unreadable checkpoints; anchors {}; {:.0} s",
        r.kills,
        r.restarts,
        r.rejoined,
        r.pauses,
        r.skipped_faults,
        r.finished,
        r.peers,
        r.abnormal_exits,
        r.unreadable_checkpoints,
        if r.anchors_agree { "identical" } else { "DIFFER" },
        r.wall_s
    );
}
