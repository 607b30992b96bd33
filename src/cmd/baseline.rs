//! `atoll baseline`: synchronous DiLoCo in one process, on the same manifest, shards and
//! seed as `atoll demo`, at the same tokens: the reference the swarm's quality is read
//! against (see `atoll::baseline`). Synchronous data-parallel at equal tokens is
//! `atoll train --batch N×B` (one gradient over the union of N batches).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use atoll::baseline::{self, SyncDiloco};
use atoll::metrics::{bits_per_byte, MetricsLog, MetricsRecord};
use atoll::proto::{MergeRule, Settings};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::swarm;

/// Name of the summary file in the run dir.
pub const SUMMARY_FILE: &str = "baseline.json";

/// Arguments of `atoll baseline`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Learners (shard `i/N` each), as `atoll demo --peers`.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub peers: u32,
    /// Inner steps per learner.
    #[arg(long, default_value_t = 300)]
    pub steps: u64,
    /// Inner steps between outer steps (default: the manifest's `h`).
    #[arg(long)]
    pub h: Option<u64>,
    /// Outer learning rate (default: the manifest's).
    #[arg(long)]
    pub outer_lr: Option<f32>,
    /// Outer Nesterov momentum (default: the manifest's).
    #[arg(long)]
    pub momentum: Option<f32>,
    /// Merge rule: rda, mean or trimmed_mean (default: the manifest's).
    #[arg(long, value_parser = parse_rule)]
    pub merge: Option<MergeRule>,
    /// Directory for metrics.jsonl and baseline.json (replaced if it holds a baseline).
    #[arg(long, default_value = "runs/baseline")]
    pub run_dir: PathBuf,
    #[command(flatten)]
    pub run: swarm::RunArgs,
}

fn parse_rule(s: &str) -> Result<MergeRule, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned()))
        .map_err(|_| format!("unknown merge rule {s:?} (rda, mean, trimmed_mean)"))
}

/// `baseline.json`.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub method: &'static str,
    pub learners: u32,
    pub steps: u64,
    pub h: u64,
    pub outer_lr: f32,
    pub momentum: f32,
    pub merge: MergeRule,
    pub tokens: u64,
    pub outer_steps: u64,
    pub final_val_loss: f64,
    pub final_val_bpb: f64,
    /// What each learner would send in ring all-reduces of f32 outer deltas.
    pub allreduce_bytes_per_learner: u64,
    /// The same for data-parallel (one all-reduce of f32 gradients per inner step).
    pub data_parallel_bytes_per_learner: u64,
    pub wall_s: f64,
    pub run_id: String,
}

pub fn main(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    swarm::prepare_dir(&args.run_dir, &[SUMMARY_FILE, atoll::metrics::FILE_NAME])?;
    let (corpus, mut manifest) = args.run.open(Some(args.steps))?;
    let p = &mut manifest.protocol;
    p.h = args.h.unwrap_or(p.h);
    p.outer_lr = args.outer_lr.unwrap_or(p.outer_lr);
    p.momentum = args.momentum.unwrap_or(p.momentum);
    p.merge = args.merge.unwrap_or(p.merge);
    let settings = Settings::new(manifest.protocol.clone())?;
    swarm::save_manifest(&args.run_dir, &manifest)?;
    let raw = settings.raw().clone();
    let shape = SyncDiloco { learners: args.peers, h: raw.h, steps: args.steps };
    println!(
        "baseline: synchronous DiLoCo, {} learners × {} steps, H {}, outer lr {}, momentum {}, {:?}",
        args.peers, args.steps, raw.h, raw.outer_lr, raw.momentum, raw.merge
    );
    let bar = ProgressBar::new(args.steps);
    bar.set_style(
        ProgressStyle::with_template("{spinner} step {pos}/{len} [{bar:30}] {msg}  ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let log = MetricsLog::new(&args.run_dir);
    let mut last = (0u64, Instant::now());
    let end =
        baseline::sync_diloco(&manifest.train, &settings, &corpus, args.run.backend, shape, |p| {
            bar.set_position(p.step);
            bar.set_message(format!("loss {:.3} outer steps {}", p.loss, p.outer_steps));
            if let Some(val_loss) = p.val_loss {
                let secs = last.1.elapsed().as_secs_f64().max(1e-9);
                let record = MetricsRecord {
                    step: p.step,
                    tokens: p.tokens,
                    train_loss: f64::from(p.loss),
                    val_loss,
                    val_bpb: bits_per_byte(val_loss),
                    tokens_per_s: (p.tokens - last.0) as f64 / secs,
                    wall_s: started.elapsed().as_secs_f64(),
                };
                last = (p.tokens, Instant::now());
                if let Err(e) = log.append(&record) {
                    say(&bar, format!("cannot append to metrics.jsonl: {e}"));
                }
                say(&bar, format!("step {} val_bpb {:.3}", p.step, record.val_bpb));
            }
        })?;
    bar.finish_and_clear();
    let model = manifest.train.model.init(&atoll::backend::Backend::Flex.device());
    let params = atoll::model::params::tensor_specs(&model).iter().map(|t| t.numel()).sum();
    let per = baseline::ring_allreduce_bytes(args.peers, params);
    let final_val_loss = end.val_loss.context("the run ended without a validation")?;
    let summary = Summary {
        method: "sync_diloco",
        learners: args.peers,
        steps: args.steps,
        h: raw.h,
        outer_lr: raw.outer_lr,
        momentum: raw.momentum,
        merge: raw.merge,
        tokens: end.tokens,
        outer_steps: end.outer_steps,
        final_val_loss,
        final_val_bpb: bits_per_byte(final_val_loss),
        allreduce_bytes_per_learner: per * end.outer_steps,
        data_parallel_bytes_per_learner: per * args.steps,
        wall_s: started.elapsed().as_secs_f64(),
        run_id: manifest.run_id().short(),
    };
    println!(
        "final val_bpb {:.3} after {} tokens ({} outer steps); all-reduce bytes per learner {} \
         (data-parallel: {})",
        summary.final_val_bpb,
        summary.tokens,
        summary.outer_steps,
        super::status::bytes(summary.allreduce_bytes_per_learner),
        super::status::bytes(summary.data_parallel_bytes_per_learner)
    );
    let path = args.run_dir.join(SUMMARY_FILE);
    atoll::checkpoint::write_atomic(&path, &serde_json::to_vec_pretty(&summary)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("summary written to {}", path.display());
    Ok(())
}

/// A line above the progress bar; printed plainly when the bar is hidden (no terminal:
/// indicatif then drops `println`), so a log file keeps it.
fn say(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        println!("{line}");
    } else {
        bar.println(line);
    }
}
