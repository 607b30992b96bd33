//! Inner-step throughput of a model preset: atoll's `Trainer::step` against a minimal
//! plain burn loop (same model, batch, optimizer) on each compiled backend, with the
//! model's FLOP/s (6 × parameters × tokens/s, attention's score matmuls not counted)
//! against the same backend's f32 matmul rate on square matrices measured in the same run
//! (`peak`: the best of a measurement before and one after the training loops, since a
//! shared VM's rate drifts by a third between seconds).
//!
//! `cargo bench --bench throughput -- [--steps N] [--backend NAME|all] [--model PRESET]
//!  [--matmul N] [--micro-batch ROWS] [--activation gelu|hard-swish] [--optimizer
//!  adamw|muon]` (the GPU backend: add `--features wgpu`; with `--micro-batch` atoll's
//! trainer runs each batch in passes of ROWS rows, the plain loop stays whole;
//! `--activation` and `--optimizer` override the preset's; with Muon the FLOP count adds
//! its Newton–Schulz iterations, [`newton_schulz_flops`]).
//! Thread count follows rayon (`RAYON_NUM_THREADS=1` for one core).

use std::time::Instant;

use atoll::backend::Backend;
use atoll::data::{Corpus, Shard};
use atoll::model::Activation;
use atoll::train::preset::Preset;
use atoll::train::{on_compute_pool, to_tensors, InnerOptimizer, TrainConfig, Trainer};
use burn::optim::GradientsParams;
use burn::tensor::{Distribution, Tensor};

const USAGE: &str = "usage: throughput [--steps N] [--backend NAME|all] [--model PRESET] \
[--matmul N] [--micro-batch ROWS] [--activation gelu|hard-swish] [--optimizer adamw|muon]";

/// Flags that take a value; `--bench` is what `cargo bench` passes.
const FLAGS: [&str; 7] =
    ["--steps", "--backend", "--model", "--matmul", "--micro-batch", "--activation", "--optimizer"];

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let mut rest = args.iter().skip(1);
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            "--bench" => {}
            flag if FLAGS.contains(&flag) => {
                rest.next().ok_or_else(|| anyhow::anyhow!("{flag} needs a value\n{USAGE}"))?;
            }
            other => anyhow::bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    let value =
        |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let steps: usize = value("--steps").map(|s| s.parse()).transpose()?.unwrap_or(30);
    let backends: Vec<Backend> = match value("--backend").as_deref() {
        None | Some("all") => Backend::all(),
        Some(name) => vec![name.parse().map_err(anyhow::Error::msg)?],
    };
    let preset = match value("--model") {
        Some(name) => <Preset as clap::ValueEnum>::from_str(&name, true)
            .map_err(|e| anyhow::anyhow!("--model: {e}"))?,
        None => Preset::Default,
    };
    let matmul_n: usize = value("--matmul").map(|s| s.parse()).transpose()?.unwrap_or(4096);
    let micro: usize = value("--micro-batch").map(|s| s.parse()).transpose()?.unwrap_or(0);
    let corpus = Corpus::embedded()?;
    let mut config = preset.train_config(0);
    if let Some(name) = value("--activation") {
        config.model.activation = <Activation as clap::ValueEnum>::from_str(&name, true)
            .map_err(|e| anyhow::anyhow!("--activation: {e}"))?;
    }
    if let Some(name) = value("--optimizer") {
        config.optimizer = <InnerOptimizer as clap::ValueEnum>::from_str(&name, true)
            .map_err(|e| anyhow::anyhow!("--optimizer: {e}"))?;
    }
    let tokens = config.tokens_per_step();
    let flops_per_token =
        6.0 * config.model.num_params() as f64 + newton_schulz_flops(&config) / tokens as f64;
    println!(
        "model: d_model {} layers {} heads {} context {} activation {:?} optimizer {:?}; batch {} ({tokens} tokens/step), atoll in passes of {} rows; {steps} steps; rayon threads {}",
        config.model.d_model,
        config.model.n_layers,
        config.model.n_heads,
        config.model.context,
        config.model.activation,
        config.optimizer,
        config.batch,
        if micro == 0 { config.batch } else { micro.min(config.batch) },
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "default".into())
    );
    println!(
        "preset {preset:?}: {} parameters; matmul peak on {matmul_n}x{matmul_n} f32",
        config.model.num_params()
    );
    println!("| backend | atoll tok/s | plain burn tok/s | ratio | atoll GFLOP/s | matmul GFLOP/s | of peak |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for backend in backends {
        // Two rounds, interleaved, keep the best of each: the machine is shared and noisy.
        let (mut atoll_best, mut plain_best) = (0.0f64, 0.0f64);
        let before = matmul_gflops(backend, matmul_n)?;
        for _ in 0..2 {
            atoll_best = atoll_best.max(atoll_loop(&config, backend, &corpus, steps, micro)?);
            plain_best = plain_best.max(plain_loop(&config, backend, &corpus, steps)?);
        }
        let peak = before.max(matmul_gflops(backend, matmul_n)?);
        let model = atoll_best * flops_per_token / 1e9;
        println!(
            "| {backend} | {atoll_best:.0} | {plain_best:.0} | {:.3} | {model:.1} | {peak:.1} | {:.1}% |",
            atoll_best / plain_best,
            100.0 * model / peak
        );
    }
    Ok(())
}

/// The FLOPs of Muon's Newton–Schulz iterations in one step of `c` (none with AdamW):
/// five per matrix of the blocks (`atoll::train::MUON_PARAMS`), each X·Xᵀ (2m²n), A·A (2m³)
/// and B·X (2m²n) on the matrix as m × n with m ≤ n (burn's Muon turns a tall one).
fn newton_schulz_flops(c: &TrainConfig) -> f64 {
    if c.optimizer.is_adamw() {
        return 0.0;
    }
    let (d, ff) = (c.model.d_model as f64, c.model.d_ff as f64);
    let matrix = |a: f64, b: f64| {
        let (m, n) = (a.min(b), a.max(b));
        5.0 * (4.0 * m * m * n + 2.0 * m * m * m)
    };
    c.model.n_layers as f64 * (4.0 * matrix(d, d) + 2.0 * matrix(d, ff))
}

/// The backend's best f32 matmul rate on `n`×`n` matrices, in GFLOP/s (best of 5 after a
/// warm-up): the same kernels and threads the model's matmuls get.
fn matmul_gflops(backend: Backend, n: usize) -> anyhow::Result<f64> {
    let device = backend.device();
    let a = Tensor::<2>::random([n, n], Distribution::Default, &device);
    let b = Tensor::<2>::random([n, n], Distribution::Default, &device);
    let mut best = f64::INFINITY;
    for round in 0..6 {
        device.sync().map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let start = Instant::now();
        let c = a.clone().matmul(b.clone());
        device.sync().map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let took = start.elapsed().as_secs_f64();
        drop(c);
        if round > 0 {
            best = best.min(took);
        }
    }
    Ok(2.0 * (n as f64).powi(3) / best / 1e9)
}

/// Tokens per second of atoll's trainer (data pipeline, schedule, loss readback included).
fn atoll_loop(
    config: &TrainConfig,
    backend: Backend,
    corpus: &Corpus,
    steps: usize,
    micro: usize,
) -> anyhow::Result<f64> {
    let mut trainer = Trainer::new(config.clone(), backend, corpus, Shard::WHOLE)?;
    trainer.set_micro_batch(micro);
    for _ in 0..3 {
        trainer.step()?;
    }
    let start = Instant::now();
    for _ in 0..steps {
        trainer.step()?;
    }
    // A GPU trainer reads its loss back every few steps: wait for the last ones, as the
    // plain loop waits for its queue.
    trainer.read_loss();
    Ok((steps * config.tokens_per_step()) as f64 / start.elapsed().as_secs_f64())
}

/// Tokens per second of the textbook burn loop on the same batches, learning rates and
/// optimizer settings as atoll's trainer: the same arithmetic on the same values, so the
/// ratio is the trainer's own cost. (With one fixed batch and a fixed learning rate, as
/// until 2026-12-02, the plain loop's activations drifted elsewhere, and burn-flex's GELU,
/// whose cost per value depends on the value, ran at another speed: GELU models read
/// 0.78–0.90, HardSwish ones 0.97–1.09, bench/RESULTS.md.)
fn plain_loop(
    config: &TrainConfig,
    backend: Backend,
    corpus: &Corpus,
    steps: usize,
) -> anyhow::Result<f64> {
    let device = backend.train_device();
    device.seed(config.seed);
    let mut model = config.model.init(&device);
    let mut optim = atoll::train::optimizer(config);
    let data = atoll::data::Dataset::new(corpus, config.model.context, config.seed, Shard::WHOLE)?;
    let mut step = 0u64;
    let mut run = |n: usize| -> anyhow::Result<()> {
        for _ in 0..n {
            let batch = data.train_batch(step, config.batch)?;
            let (inputs, targets) = to_tensors(&batch, &device);
            let loss = model.loss(inputs, targets);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(config.schedule.at(step), model.clone(), grads);
            step += 1;
        }
        Ok(())
    };
    // On a thread of the compute pool, as the trainer runs its steps (`on_compute_pool`).
    on_compute_pool(backend, || run(3))?;
    let start = Instant::now();
    on_compute_pool(backend, || run(steps))?;
    // Make sure queued work is done before the clock stops.
    device.sync().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok((steps * config.tokens_per_step()) as f64 / start.elapsed().as_secs_f64())
}
