//! `atoll train`: one peer alone, with progress, validation, metrics and checkpoints.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use atoll::backend::Backend;
use atoll::checkpoint;
use atoll::data::{Corpus, Shard};
use atoll::metrics::{bits_per_byte, MetricsLog, MetricsRecord};
use atoll::model::Activation;
use atoll::train::preset::{self, Preset};
use atoll::train::{InnerOptimizer, LossMean, TrainConfig, Trainer};
use indicatif::{ProgressBar, ProgressStyle};

/// Arguments of `atoll train`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Train until this many inner steps in total (a resumed run counts its earlier steps).
    #[arg(long, default_value_t = 300)]
    pub steps: u64,
    /// Directory for checkpoint, metrics.jsonl and logs; an existing checkpoint is resumed.
    #[arg(long)]
    pub run_dir: PathBuf,
    /// Train on this text file, JSONL file (`*.jsonl`, one `{"text": …}` per line) or
    /// directory of them instead of the embedded corpus (read from disk as it trains)..
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Run seed: initial weights and data shuffle.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// This peer's data shard, `I/N`.
    #[arg(long, default_value = "0/1")]
    pub shard: Shard,
    /// Backend: flex or ndarray (CPU), wgpu (GPU, when built with
    /// `--features wgpu`).
    #[arg(long, default_value = "flex")]
    pub backend: Backend,
    /// Start from scratch even if the run dir holds a checkpoint (it is overwritten).
    #[arg(long)]
    pub fresh: bool,
    /// Write a checkpoint every this many steps (and at the end).
    #[arg(long, default_value_t = 100)]
    pub checkpoint_every: u64,
    /// Run each step's batch in passes of at most ROWS rows, their gradients summed
    /// before the one optimizer step: the same step, with the activations of one pass in
    /// memory instead of the whole batch's. Default: the whole batch, or the most rows
    /// that fit this machine's available memory.
    #[arg(long, value_name = "ROWS", value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub micro_batch: Option<u64>,
    #[command(flatten)]
    pub hyper: Hyper,
}

/// Model and optimizer settings (defaults are the shared default of `train` and the swarm).
#[derive(Debug, Clone, clap::Args)]
pub struct Hyper {
    /// Model size: the whole configuration the flags below adjust.
    #[arg(long, value_enum, default_value_t)]
    pub model: Preset,
    /// Windows per batch.
    #[arg(long)]
    pub batch: Option<usize>,
    /// Peak inner learning rate.
    #[arg(long)]
    pub lr: Option<f64>,
    /// Context length in bytes.
    #[arg(long)]
    pub context: Option<usize>,
    /// Width of the model.
    #[arg(long)]
    pub d_model: Option<usize>,
    /// Number of transformer blocks.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Attention heads.
    #[arg(long)]
    pub heads: Option<usize>,
    /// The feed-forward activation: `hard-swish` trains 1.3–1.5× faster on the CPU than
    /// GELU at 1–3% higher val_bpb per step (bench/RESULTS.md). Default: the preset's.
    #[arg(long, value_enum)]
    pub activation: Option<Activation>,
    /// The inner optimizer of the blocks' weight matrices (the rest always take AdamW).
    /// Default: the preset's (muon for `default`, adamw for the others).
    #[arg(long, value_enum)]
    pub optimizer: Option<InnerOptimizer>,
    /// Validation every this many steps.
    #[arg(long)]
    pub val_every: Option<u64>,
}

impl Hyper {
    /// The preset's config with these overrides; `steps` sets the cosine horizon.
    pub fn config(&self, seed: u64, steps: u64) -> TrainConfig {
        let mut c = self.model.train_config(seed);
        c.schedule.decay_steps = steps.max(1);
        c.batch = self.batch.unwrap_or(c.batch);
        c.schedule.peak = self.lr.unwrap_or(c.schedule.peak);
        c.model.context = self.context.unwrap_or(c.model.context);
        if let Some(d) = self.d_model {
            c.model.d_model = d;
            c.model.d_ff = 4 * d;
        }
        c.model.n_layers = self.layers.unwrap_or(c.model.n_layers);
        c.model.n_heads = self.heads.unwrap_or(c.model.n_heads);
        c.model.activation = self.activation.unwrap_or(c.model.activation);
        c.val_every = self.val_every.unwrap_or(c.val_every);
        c.optimizer = self.optimizer.unwrap_or(c.optimizer);
        c
    }
}

/// Loads `--data` or the embedded corpus.
pub fn load_corpus(data: Option<&Path>) -> anyhow::Result<Corpus> {
    Ok(match data {
        Some(path) => Corpus::load(path)?,
        None => Corpus::embedded()?,
    })
}

pub fn main(args: Args) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.run_dir)
        .with_context(|| format!("cannot create run dir {}", args.run_dir.display()))?;
    let corpus = load_corpus(args.data.as_deref())?;
    let ckpt_path = checkpoint::path_in(&args.run_dir);
    let mut trainer = if ckpt_path.exists() && !args.fresh {
        let ckpt = checkpoint::load(&ckpt_path)?;
        tracing::info!(step = ckpt.meta.state.step, path = %ckpt_path.display(), "resuming from checkpoint");
        ckpt.on(args.backend).into_trainer(&corpus)?
    } else {
        Trainer::new(args.hyper.config(args.seed, args.steps), args.backend, &corpus, args.shard)?
    };
    trainer.set_micro_batch(preset::check_machine(trainer.config(), 1, args.micro_batch)?);
    let params = burn::module::Module::num_params(trainer.model());
    tracing::info!(
        corpus = corpus.name(),
        train_bytes = trainer.dataset().train_bytes(),
        val_bytes = trainer.dataset().val_bytes(),
        params,
        backend = %trainer.backend(),
        micro_batch = trainer.micro_batch(),
        "training"
    );
    run_loop(&mut trainer, &args, &corpus)
}

fn run_loop(trainer: &mut Trainer, args: &Args, corpus: &Corpus) -> anyhow::Result<()> {
    let start_step = trainer.state().step;
    if start_step >= args.steps {
        println!(
            "run dir already holds step {start_step} >= --steps {}; nothing to do",
            args.steps
        );
        return Ok(());
    }
    let log = MetricsLog::new(&args.run_dir);
    let bar = progress_bar(args.steps, start_step);
    let started = Instant::now();
    let (mut window, mut window_start, mut window_tokens) =
        (LossMean::default(), Instant::now(), 0u64);
    let val_every = trainer.config().val_every;
    let mut last_loss = f32::NAN;
    while trainer.state().step < args.steps {
        let stats = trainer.step()?;
        let step = trainer.state().step;
        let validate = step % val_every == 0 || step == args.steps;
        let rest = if validate { trainer.read_loss() } else { (None, 0) };
        for reading in [(stats.loss, stats.losses), rest] {
            window.add(reading).map_err(|loss| {
                anyhow::anyhow!("training diverged by step {step} (loss {loss})")
            })?;
            last_loss = reading.0.unwrap_or(last_loss);
        }
        window_tokens += stats.tokens as u64;
        let tok_s = window_tokens as f64 / window_start.elapsed().as_secs_f64().max(1e-9);
        bar.set_position(step);
        bar.set_message(format!("loss {last_loss:.3}  {tok_s:.0} tok/s"));
        if validate {
            let val_loss = trainer.evaluate();
            let record = MetricsRecord {
                step,
                tokens: trainer.state().tokens,
                train_loss: window.mean(),
                val_loss,
                val_bpb: bits_per_byte(val_loss),
                tokens_per_s: tok_s,
                wall_s: started.elapsed().as_secs_f64(),
            };
            log.append(&record).context("cannot append to metrics.jsonl")?;
            bar.suspend(|| {
                tracing::info!(
                    step,
                    train_loss = format!("{:.3}", record.train_loss),
                    val_bpb = format!("{:.3}", record.val_bpb),
                    tokens_per_s = format!("{tok_s:.0}"),
                    "validation"
                )
            });
            (window, window_start, window_tokens) = (LossMean::default(), Instant::now(), 0);
        }
        if step % args.checkpoint_every == 0 || step == args.steps {
            checkpoint::save(trainer, trainer.dataset().shard(), corpus, &args.run_dir)?;
        }
    }
    bar.finish_and_clear();
    println!(
        "trained {} steps in {:.1} s; checkpoint {}",
        args.steps - start_step,
        started.elapsed().as_secs_f64(),
        checkpoint::path_in(&args.run_dir).display()
    );
    Ok(())
}

fn progress_bar(total: u64, position: u64) -> ProgressBar {
    let bar = ProgressBar::new(total).with_position(position);
    let style =
        ProgressStyle::with_template("{spinner} step {pos}/{len} [{bar:30}] {msg}  ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
    bar.set_style(style);
    bar
}
