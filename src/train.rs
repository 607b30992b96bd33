//! The inner loop: one peer's AdamW training of its own copy of the model.
//!
//! The trainer owns model, optimizer and data stream and knows nothing of the network.
//! Batches depend only on `(seed, shard, step)` (see [`crate::data`]), so a trainer rebuilt
//! from a checkpoint continues exactly where it stopped.

mod config;
mod grad_io;
pub mod pace;
mod passes;
pub mod preset;
pub mod schedule;
#[cfg(test)]
mod tests;

use burn::grad_clipping::GradientClippingConfig;
use burn::module::Module;
use burn::module::ParamGroup;
use burn::optim::{AdamWConfig, AdjustLrFn, GradientsParams, ModuleOptimizer, MuonConfig};
use burn::tensor::{Device, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::data::{Batch, Corpus, DataError, Dataset, Shard};
use crate::model::{Lm, ModelConfigError};

pub use config::{InnerOptimizer, TrainConfig};
pub use schedule::LrSchedule;

/// A training configuration that makes no sense, or data that does not fit it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    #[error(transparent)]
    Model(#[from] ModelConfigError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("invalid training setting: {0}")]
    Setting(String),
    #[error("{0}")]
    Backend(String),
}

/// Counters that advance with every inner step (saved in checkpoints).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainState {
    /// Inner steps taken; also the data position (batches are a function of it).
    pub step: u64,
    /// Tokens trained on.
    pub tokens: u64,
}

/// A GPU trainer reads its training loss back every this many steps: a read waits for
/// the device to finish everything queued, which stalled it once a step (measured on an
/// H200: the trainer at 0.83–0.95 of a plain loop that never reads).
pub const GPU_LOSS_EVERY: u32 = 16;

/// What one inner step reports.
#[derive(Debug, Clone, Copy)]
pub struct StepStats {
    /// Mean training loss of the `losses` steps since the last reading, if this step read
    /// it back from the device: every step on a CPU backend, every [`GPU_LOSS_EVERY`]
    /// steps on a GPU.
    pub loss: Option<f32>,
    pub losses: u32,
    pub lr: f64,
    pub tokens: usize,
}

/// The mean training loss of a window of steps, from the readings a trainer gives (each
/// the mean of `losses` steps, see [`StepStats`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct LossMean {
    sum: f64,
    steps: u64,
}

impl LossMean {
    /// Adds a reading, if there is one; `Err` with the loss if it is not finite (training
    /// diverged). The reading counts either way.
    pub fn add(&mut self, (loss, losses): (Option<f32>, u32)) -> Result<(), f32> {
        let Some(loss) = loss else { return Ok(()) };
        self.sum += f64::from(loss) * f64::from(losses);
        self.steps += u64::from(losses);
        if loss.is_finite() {
            Ok(())
        } else {
            Err(loss)
        }
    }

    /// The mean over the steps read so far (0 before any).
    pub fn mean(&self) -> f64 {
        self.sum / self.steps.max(1) as f64
    }
}

/// One peer's model, optimizer and data stream.
pub struct Trainer {
    config: TrainConfig,
    backend: Backend,
    device: Device,
    model: Lm,
    optim: ModuleOptimizer,
    data: Dataset,
    /// The fixed validation set, read once (its files may be on disk).
    val: Vec<Batch>,
    /// Training losses not yet read back from the device: their sum there, and how many.
    pending_loss: Option<(Tensor<1>, u32)>,
    state: TrainState,
    /// Rows per forward and backward pass (0: the whole batch at once); see
    /// [`Trainer::set_micro_batch`].
    micro_batch: usize,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("config", &self.config)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// Runs `f` on a thread of the current rayon pool (the process's compute pool) and waits
/// for it, for a CPU `backend`; directly where the caller is a pool thread already, or for
/// a GPU backend (with its steps on pool threads, a wgpu peer's loss turned NaN within 64
/// steps in `tests/gpu_swarm.rs` on lavapipe; burn's GPU runtime is not known to be safe
/// with a step's work moving between threads, and gains nothing from it). A step's tensor operations split their
/// work over the pool: called from a pool thread, the caller takes its share and steals
/// the rest back, where from any other thread every operation is handed to the pool and
/// waited for, a wake-up and a sleep per operation (the default model trained 1.3–1.4×
/// faster on a pool thread; bench/RESULTS.md, "Steps on the compute pool").
pub fn on_compute_pool<R: Send>(backend: Backend, f: impl FnOnce() -> R + Send) -> R {
    if backend.is_gpu() || rayon::current_thread_index().is_some() {
        f()
    } else {
        rayon::scope(|_| f())
    }
}

impl Trainer {
    /// A fresh trainer: weights initialised from the run seed (the same on every peer).
    pub fn new(
        config: TrainConfig,
        backend: Backend,
        corpus: &Corpus,
        shard: Shard,
    ) -> Result<Self, TrainError> {
        config.validate()?;
        let data = Dataset::new(corpus, config.model.context, config.seed, shard)?;
        let val = data.val_batches(config.val_batches, config.batch)?;
        backend.check().map_err(TrainError::Backend)?;
        let device = backend.train_device();
        let model = init_model(&config, &device);
        let optim = optimizer(&config);
        let state = TrainState::default();
        let pending_loss = None;
        let micro_batch = 0;
        Ok(Self {
            config,
            backend,
            device,
            model,
            optim,
            data,
            val,
            pending_loss,
            state,
            micro_batch,
        })
    }

    /// One AdamW step on the next batch of this peer's shard. Fails, taking no step, only
    /// if the batch cannot be read (a corpus file changed or vanished).
    pub fn step(&mut self) -> Result<StepStats, DataError> {
        let batch = self.data.train_batch(self.state.step, self.config.batch)?;
        let (loss, grads) = on_compute_pool(self.backend, || self.gradients(&batch));
        self.pending_loss = Some(match self.pending_loss.take() {
            Some((sum, n)) => (sum + loss, n + 1),
            None => (loss, 1),
        });
        let lr = self.config.schedule.at(self.state.step);
        let (optim, model) = (&mut self.optim, self.model.clone());
        self.model = on_compute_pool(self.backend, || optim.step(lr, model, grads));
        self.state.step += 1;
        self.state.tokens += batch.tokens() as u64;
        let every = if self.backend.is_gpu() { GPU_LOSS_EVERY } else { 1 };
        let read = self.pending_loss.as_ref().is_some_and(|(_, n)| *n >= every);
        let (loss, losses) = if read { self.read_loss() } else { (None, 0) };
        Ok(StepStats { loss, losses, lr, tokens: batch.tokens() })
    }

    /// Reads back the mean of the training losses not read yet (waiting for the device),
    /// and how many steps it covers; `(None, 0)` if there are none.
    pub fn read_loss(&mut self) -> (Option<f32>, u32) {
        match self.pending_loss.take() {
            Some((sum, n)) => (Some(sum.into_scalar::<f32>() / n as f32), n),
            None => (None, 0),
        }
    }

    /// One AdamW step whose gradient first goes through `reduce`, flattened over every
    /// float parameter in [`crate::model::params::tensor_specs`] order: data-parallel
    /// training replaces it by the mean over its peers. If `reduce` fails, no step is
    /// taken and the error is returned (so is a batch that cannot be read).
    pub fn step_reduced<E: From<DataError>>(
        &mut self,
        reduce: impl FnOnce(&mut Vec<f32>) -> Result<(), E>,
    ) -> Result<StepStats, E> {
        let batch = self.data.train_batch(self.state.step, self.config.batch)?;
        self.step_on(&batch, reduce)
    }

    /// [`Trainer::step_reduced`] on a given batch instead of this trainer's next one.
    pub fn step_on<E>(
        &mut self,
        batch: &Batch,
        reduce: impl FnOnce(&mut Vec<f32>) -> Result<(), E>,
    ) -> Result<StepStats, E> {
        let (inputs, targets) = to_tensors(batch, &self.device);
        let (loss_value, mut grads) = on_compute_pool(self.backend, || {
            let loss = self.model.loss(inputs, targets);
            let loss_value = loss.clone().into_scalar::<f32>();
            (loss_value, GradientsParams::from_grads(loss.backward(), &self.model))
        });
        let mut flat = Vec::new();
        let mut layout = Vec::new();
        self.model.visit(&mut grad_io::Take {
            grads: &mut grads,
            flat: &mut flat,
            layout: &mut layout,
        });
        reduce(&mut flat)?;
        self.model.visit(&mut grad_io::Put {
            grads: &mut grads,
            flat: &flat,
            layout: &layout,
            at: 0,
        });
        let lr = self.config.schedule.at(self.state.step);
        let (optim, model) = (&mut self.optim, self.model.clone());
        self.model = on_compute_pool(self.backend, || optim.step(lr, model, grads));
        self.state.step += 1;
        self.state.tokens += batch.tokens() as u64;
        Ok(StepStats { loss: Some(loss_value), losses: 1, lr, tokens: batch.tokens() })
    }

    /// Mean validation loss in nats per byte over the fixed validation set.
    pub fn evaluate(&self) -> f64 {
        on_compute_pool(self.backend, || self.evaluate_here())
    }

    fn evaluate_here(&self) -> f64 {
        let model = self.model.valid();
        let device = self.backend.device();
        let total: f64 = self
            .val
            .iter()
            .map(|b| {
                let (inputs, targets) = to_tensors(b, &device);
                f64::from(model.loss(inputs, targets).into_scalar::<f32>())
            })
            .sum();
        total / self.val.len() as f64
    }

    pub fn config(&self) -> &TrainConfig {
        &self.config
    }
    pub fn backend(&self) -> Backend {
        self.backend
    }
    pub fn state(&self) -> TrainState {
        self.state
    }
    pub fn model(&self) -> &Lm {
        &self.model
    }
    /// Mutable model access, for writing merged fragments between two steps.
    pub fn model_mut(&mut self) -> &mut Lm {
        &mut self.model
    }
    pub fn dataset(&self) -> &Dataset {
        &self.data
    }

    /// Parts for a checkpoint: model and optimizer state as burnpack bytes.
    pub(crate) fn snapshot(&self) -> Result<(Vec<u8>, Vec<u8>), burn::store::RecordError> {
        let model = self.model.clone().into_record().into_bytes()?;
        let optim = self.optim.into_bytes()?;
        Ok((model.to_vec(), optim.to_vec()))
    }

    /// Rebuilds a trainer from checkpoint parts (already integrity-checked).
    pub(crate) fn restore(
        config: TrainConfig,
        backend: Backend,
        corpus: &Corpus,
        shard: Shard,
        state: TrainState,
        model_bytes: Vec<u8>,
        optim_bytes: Vec<u8>,
    ) -> Result<Self, RestoreError> {
        let mut trainer = Self::new(config, backend, corpus, shard)?;
        let model_bytes = burn::tensor::Bytes::from_bytes_vec(model_bytes);
        // burn panics on a float parameter stored in another dtype (fuzz finding F3)
        // instead of returning an error: every parameter of the model is a float.
        let unusable = |e: burn_pack::Error| RestoreError::Unusable(e.to_string());
        let pack = burn_pack::Reader::from_bytes(model_bytes.clone()).map_err(unusable)?;
        for t in pack.into_tensors().map_err(unusable)? {
            if !t.dtype.is_float() {
                let why = format!("parameter {} is stored as {:?}", t.name, t.dtype);
                return Err(RestoreError::Unusable(why));
            }
        }
        // Any other panic of burn on a well-formed record is contained too: a bad
        // checkpoint is an error, never a crash.
        let load = std::panic::AssertUnwindSafe(|| -> Result<_, burn::store::RecordError> {
            let record = burn::store::ModuleRecord::from_bytes(model_bytes)?;
            let model = trainer.model.clone().try_load_record(record)?;
            let optim = optimizer(&trainer.config)
                .from_bytes(burn::tensor::Bytes::from_bytes_vec(optim_bytes))?;
            Ok((model, optim))
        });
        let (model, optim) = std::panic::catch_unwind(load).map_err(|panic| {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown reason");
            RestoreError::Unusable(why.to_owned())
        })??;
        trainer.model = model;
        trainer.optim = optim;
        trainer.state = state;
        Ok(trainer)
    }
}

/// Errors in rebuilding a trainer from checkpoint parts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RestoreError {
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error("checkpoint tensors do not fit the model: {0}")]
    Record(#[from] burn::store::RecordError),
    #[error("checkpoint tensors cannot be loaded: {0}")]
    Unusable(String),
}

/// The trainer's optimizer, set from `config`: AdamW (betas, weight decay, gradient
/// clipping) for every parameter, or, with [`InnerOptimizer::Muon`], for all but the
/// blocks' weight matrices ([`MUON_PARAMS`]), which Muon steps.
pub fn optimizer(config: &TrainConfig) -> ModuleOptimizer {
    let adamw = AdamWConfig::new()
        .with_beta_1(config.beta1)
        .with_beta_2(config.beta2)
        .with_epsilon(1e-8)
        .with_weight_decay(config.weight_decay)
        .with_grad_clipping(Some(GradientClippingConfig::Norm(config.clip_norm)))
        .init();
    match config.optimizer {
        InnerOptimizer::Adamw => adamw,
        InnerOptimizer::Muon => {
            let muon = MuonConfig::new()
                .with_adjust_lr_fn(AdjustLrFn::MatchRmsAdamW)
                .with_weight_decay(Some(burn::optim::decay::WeightDecayConfig::new(
                    config.weight_decay,
                )))
                .build();
            let matrices = ParamGroup::from_regex(MUON_PARAMS).expect("a valid pattern");
            adamw.with_group(matrices, muon, None)
        }
    }
}

/// The parameters Muon steps: the blocks' attention and feed-forward weight matrices, by
/// their module path (`burn::nn::transformer`'s field names).
pub const MUON_PARAMS: &str =
    r"^blocks\.layers\.\d+\.(mha\.(query|key|value|output)|pwff\.linear_(inner|outer))\.weight$";

/// The model initialised from the run seed. Seeding and drawing go through the backend's
/// global generator, and burn draws a parameter lazily, at its first use: every parameter
/// is drawn here, under one process-wide lock, so the weights depend on the seed alone —
/// not on what else this process drew before (a second trainer in one process used to
/// start from other weights than the first).
pub fn init_model(config: &TrainConfig, device: &Device) -> Lm {
    struct Draw;
    impl burn::module::ModuleVisitor for Draw {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D>>) {
            // Materialises the lazy initialisation.
            let _ = param.val();
        }
    }
    // The weights are drawn by one backend's generator whatever the peer trains on, so
    // peers on different backends start from the same anchors; the values then move to
    // `device` as plain f32s.
    let cpu = Backend::Flex.train_device();
    let drawn = {
        static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _guard = INIT.lock().unwrap_or_else(|p| p.into_inner());
        cpu.seed(config.seed);
        let model = config.model.init(&cpu);
        model.visit(&mut Draw);
        model
    };
    if *device == cpu {
        return drawn;
    }
    crate::model::params::copy_params(&drawn, config.model.init(device))
        .expect("two models of one configuration have the same parameters")
}

/// Input and target tensors `[rows, context]` of a batch.
pub fn to_tensors(batch: &Batch, device: &Device) -> (Tensor<2, Int>, Tensor<2, Int>) {
    let shape = [batch.rows, batch.context];
    let inputs = Tensor::from_data(TensorData::new(batch.inputs.clone(), shape), device);
    let targets = Tensor::from_data(TensorData::new(batch.targets.clone(), shape), device);
    (inputs, targets)
}
