//! `atoll sample`: text from the latest checkpoint of a run dir.

use std::io::Write;
use std::path::PathBuf;

use atoll::checkpoint;

use super::train::load_corpus;

/// Arguments of `atoll sample`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run dir holding a checkpoint.
    #[arg(long)]
    pub run_dir: PathBuf,
    /// Text to continue.
    #[arg(long, default_value = "ROMEO.\n")]
    pub prompt: String,
    /// Bytes to generate.
    #[arg(long, default_value_t = 400)]
    pub len: usize,
    /// Sampling temperature (lower is more conservative).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The text the run trained on, if not the embedded corpus.
    #[arg(long)]
    pub data: Option<PathBuf>,
}

pub fn main(args: Args) -> anyhow::Result<()> {
    let ckpt = checkpoint::load(&checkpoint::path_in(&args.run_dir))?;
    let step = ckpt.meta.state.step;
    let corpus = load_corpus(args.data.as_deref())?;
    let trainer = ckpt.into_trainer(&corpus)?;
    let device = trainer.backend().device();
    let model = burn::module::Module::valid(trainer.model());
    let text = atoll::sample::generate(
        &model,
        &device,
        args.prompt.as_bytes(),
        args.len,
        args.temperature,
        args.seed,
    );
    let mut out = std::io::stdout().lock();
    writeln!(out, "# step {step}")?;
    out.write_all(args.prompt.as_bytes())?;
    out.write_all(&text)?;
    writeln!(out)?;
    Ok(())
}
