//! Local swarms of `atoll run` processes on loopback, shared by `atoll demo` and
//! `atoll chaos`: the run directory, the peers' command lines, starting the first peer and
//! its bootstrap address, the live view ([`Console`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use atoll::backend::Backend;
use atoll::data::Corpus;
use atoll::fleet::{self, Process, Spec, Until};
use atoll::fragment::FragmentPlan;
use atoll::manifest::{self, Manifest};
use atoll::model::Activation;
use atoll::rundir::anchors;
use atoll::rundir::status;
use atoll::train::preset::Preset;
use atoll::train::{InnerOptimizer, TrainConfig};

mod console;
pub use console::Console;

/// The swarm name of local swarm runs.
const SWARM_NAME: &str = "atoll-demo";

/// The run a local swarm command trains (`demo`, `chaos`, `baseline`).
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Train on this text file, JSONL file (`*.jsonl`, one `{"text": …}` per line) or
    /// directory of them instead of the embedded corpus (read from disk as it trains)..
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Run seed: initial weights and data order (chaos: the fault schedule too).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Use this run manifest instead of the default one (its `epoch_unix_ms` is reset).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Model size of the default run (a `--config` manifest names its own model).
    #[arg(long, value_enum, conflicts_with = "config")]
    pub model: Option<Preset>,
    /// The default run's feed-forward activation (`atoll train --activation`). Default:
    /// the preset's.
    #[arg(long, value_enum, conflicts_with = "config")]
    pub activation: Option<Activation>,
    /// The default run's inner optimizer of the blocks' weight matrices (`atoll train
    /// --optimizer`). Default: the preset's.
    #[arg(long, value_enum, conflicts_with = "config")]
    pub optimizer: Option<InnerOptimizer>,
    /// Backend of every peer: flex or ndarray (CPU), wgpu (GPU, when built with
    /// `--features wgpu`).
    #[arg(long, default_value = "flex")]
    pub backend: Backend,
    /// Every peer runs each step's batch in passes of at most ROWS rows (`atoll run
    /// --micro-batch`). Default: the whole batch, or the most rows that fit this machine's
    /// available memory with all the peers running.
    #[arg(long, value_name = "ROWS", value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub micro_batch: Option<u64>,
}

/// The step floor of every peer of a local swarm (demo, chaos).
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Pace {
    /// Every peer's inner steps take at least MS milliseconds (`atoll run --min-step-ms`):
    /// a fixed step rate per peer, as if each had a machine of its own, so a killed peer's
    /// CPU does not speed the survivors up, and a run is as long on a faster CPU. Pick MS
    /// above a step's compute time with all peers running.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub min_step_ms: Option<u64>,
}

impl Pace {
    /// `spec` with `--min-step-ms`, if set.
    pub fn apply(self, spec: Spec) -> Spec {
        match self.min_step_ms {
            Some(ms) => spec.arg("--min-step-ms").arg(&ms.to_string()),
            None => spec,
        }
    }
}

impl RunArgs {
    /// The corpus and the run manifest (see [`manifest`]).
    pub fn open(&self, decay_steps: Option<u64>) -> anyhow::Result<(Corpus, Manifest)> {
        let corpus = super::train::load_corpus(self.data.as_deref())?;
        let preset = self.model.unwrap_or_default();
        // `--model`, `--activation` and `--optimizer` conflict with `--config`: they shape
        // a new run only.
        let mut train = preset.train_config(self.seed);
        train.model.activation = self.activation.unwrap_or(train.model.activation);
        train.optimizer = self.optimizer.unwrap_or(train.optimizer);
        let manifest = manifest(self.config.as_deref(), preset, train, decay_steps, &corpus)?;
        Ok((corpus, manifest))
    }

    /// Checks that `peers` peers of `manifest` fit this machine, and sets the rows per
    /// pass they run in when only micro-batches fit (unless `--micro-batch` chose).
    pub fn fit(&mut self, manifest: &Manifest, peers: u32) -> anyhow::Result<()> {
        let rows = atoll::train::preset::check_machine(
            &manifest.train,
            u64::from(peers),
            self.micro_batch,
        )?;
        self.micro_batch = (rows > 0).then_some(rows as u64);
        Ok(())
    }
}

/// The run manifest of a local swarm: `config`, or a new run of `preset` training `train`
/// (the preset's, with the command line's choices) and, if given, a learning-rate decay over
/// `decay_steps`; its epoch is set to now.
pub fn manifest(
    config: Option<&Path>,
    preset: Preset,
    mut train: TrainConfig,
    decay_steps: Option<u64>,
    corpus: &Corpus,
) -> anyhow::Result<Manifest> {
    let mut manifest = match config {
        Some(path) => Manifest::load(path)?,
        None => {
            if let Some(steps) = decay_steps {
                train.schedule.decay_steps = steps.max(1);
            }
            let protocol = manifest::preset_protocol(preset, train.optimizer);
            Manifest::new(SWARM_NAME, train, corpus, protocol)
        }
    };
    manifest.epoch_unix_ms = status::unix_ms();
    manifest.validate()?;
    manifest.check_corpus(corpus)?;
    Ok(manifest)
}

/// Writes the manifest into a swarm dir; returns its path.
pub fn save_manifest(dir: &Path, manifest: &Manifest) -> anyhow::Result<PathBuf> {
    let path = dir.join(manifest::FILE_NAME);
    atoll::checkpoint::write_atomic(&path, &manifest.to_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// Creates a swarm dir, removing peer dirs and the `outputs` of an earlier run there. A
/// non-empty directory without a run manifest is refused.
pub fn prepare_dir(dir: &Path, outputs: &[&str]) -> anyhow::Result<()> {
    if dir.exists() {
        let is_swarm = dir.join(manifest::FILE_NAME).exists();
        let entries: Vec<_> = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read {}", dir.display()))?
            .filter_map(Result::ok)
            .collect();
        if !is_swarm && !entries.is_empty() {
            bail!("{} exists and is not a swarm directory; give another --run-dir", dir.display());
        }
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("peer-") || outputs.contains(&name.as_str()) {
                let path = e.path();
                let removed = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                removed.with_context(|| format!("cannot remove {}", path.display()))?;
            }
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))
}

/// The run dir of peer `index` in a swarm dir.
pub fn peer_dir(swarm: &Path, index: u32) -> PathBuf {
    swarm.join(format!("peer-{index}"))
}

/// What every peer of a local swarm shares: the swarm dir, the manifest, the data, the pace.
pub struct Launcher<'a> {
    pub dir: &'a Path,
    pub manifest: &'a Path,
    pub run: &'a RunArgs,
    pub pace: Pace,
    /// Peers in all, late ones included: each trains its own shard of the data.
    pub peers: u32,
}

impl Launcher<'_> {
    /// The `atoll run` of peer `index` (in [`peer_dir`]), training `until` on `backend`,
    /// bootstrapping from `bootstrap`.
    pub fn spec(&self, index: u32, until: Until, backend: Backend, bootstrap: &[String]) -> Spec {
        let shard = format!("{index}/{}", self.peers);
        let spec = Spec::train(peer_dir(self.dir, index), self.manifest, &shard, until)
            .bootstrap(bootstrap.iter().cloned())
            .backend(backend)
            .data(self.run.data.as_deref());
        let spec = match self.run.micro_batch {
            Some(rows) => spec.arg("--micro-batch").arg(&rows.to_string()),
            None => spec,
        };
        self.pace.apply(spec)
    }

    /// Starts the first peer and waits for the address the others bootstrap from.
    pub fn start_first(&self, spec: &Spec) -> anyhow::Result<(Process, String)> {
        let mut process = start(spec)?;
        let addr = listen_addr(&spec.dir, &mut process, 0, Duration::from_secs(60))?;
        Ok((process, addr))
    }
}

/// Starts one peer of a local swarm with this executable (see [`fleet::Spec::start`]).
pub fn start(spec: &Spec) -> anyhow::Result<Process> {
    let exe = std::env::current_exe().context("cannot find the atoll executable")?;
    spec.start(&exe).with_context(|| format!("cannot start a peer in {}", spec.dir.display()))
}

/// Waits for the TCP listen address a freshly started peer writes to its status file, for
/// others to bootstrap from. `since_unix_ms` skips the status file of an earlier life.
pub fn listen_addr(
    dir: &Path,
    process: &mut Process,
    since_unix_ms: u64,
    timeout: Duration,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(a) = fleet::listen_addr(dir, process.pid(), since_unix_ms) {
            return Ok(a);
        }
        if let Some(exit) = process.poll_exit()? {
            bail!("{} exited ({exit}) before listening:\n{}", dir.display(), log_tail(dir));
        }
        if Instant::now() > deadline {
            bail!("{} did not start listening:\n{}", dir.display(), log_tail(dir));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last lines of a peer's log, for error messages.
pub fn log_tail(dir: &Path) -> String {
    fleet::tail(&dir.join(fleet::LOG_FILE), 15)
}

/// Consensus distance of the peers' saved anchors, averaged over fragments.
pub fn consensus<'a>(
    manifest: &Manifest,
    dirs: impl Iterator<Item = &'a Path>,
) -> anyhow::Result<f64> {
    let model = manifest.train.model.init(&Backend::Flex.device());
    let specs = atoll::model::params::tensor_specs(&model);
    let plan = FragmentPlan::new(&specs, manifest.protocol.fragments)?;
    let mut states = Vec::new();
    for dir in dirs {
        match anchors::load(dir, &plan) {
            Ok(Some(s)) => states.push(s),
            Ok(None) => bail!("{} holds no anchors", dir.display()),
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
