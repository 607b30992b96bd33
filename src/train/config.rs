//! The inner loop's settings: model, batch, AdamW and the run seed (part of the run
//! manifest).

use serde::{Deserialize, Serialize};

use super::{LrSchedule, TrainError};
use crate::model::ModelConfig;

/// Everything that shapes one peer's inner training. Part of the run manifest later.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    pub model: ModelConfig,
    /// Windows per batch; tokens per step = `batch * model.context`.
    pub batch: usize,
    /// Learning-rate schedule of the inner AdamW.
    pub schedule: LrSchedule,
    pub beta1: f32,
    pub beta2: f32,
    pub weight_decay: f32,
    /// Gradient clipping by L2 norm (burn clips each parameter tensor's gradient).
    pub clip_norm: f32,
    /// Run seed: initial weights and the data shuffle.
    pub seed: u64,
    /// Validation every this many steps (and at the end).
    pub val_every: u64,
    /// Batches in one validation pass.
    pub val_batches: usize,
    /// The inner optimizer of the blocks' weight matrices. AdamW where a manifest names none
    /// (and left out of one that chose AdamW), so a manifest written before the setting
    /// existed keeps its meaning and its run id.
    #[serde(default, skip_serializing_if = "InnerOptimizer::is_adamw")]
    pub optimizer: InnerOptimizer,
}

/// What steps the blocks' weight matrices (attention and feed-forward projections); the
/// embeddings, the head, the norms and every bias always take AdamW.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum InnerOptimizer {
    /// AdamW with the config's betas, weight decay and clipping.
    #[default]
    Adamw,
    /// Muon (momentum 0.95, Nesterov, five Newton–Schulz iterations, burn's own), with its
    /// rate matched to AdamW's update size (`0.2·√max(rows, cols)`), so one schedule serves
    /// both, and the config's weight decay. MuLoCo (arXiv 2505.23725) reports that its outer
    /// deltas survive low-bit codes better than AdamW's; on the default model they lose
    /// more to a sparser top-k code (bench/RESULTS.md, "Muon as the inner optimizer").
    Muon,
}

impl InnerOptimizer {
    pub fn is_adamw(&self) -> bool {
        *self == Self::Adamw
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            model: ModelConfig::new(),
            batch: 8,
            schedule: LrSchedule::default(),
            beta1: 0.9,
            beta2: 0.95,
            weight_decay: 0.1,
            clip_norm: 1.0,
            seed: 0,
            val_every: 50,
            val_batches: 8,
            // The default model learns faster with Muon in the same time (bench/RESULTS.md,
            // "Muon as the inner optimizer"); a manifest that names none still means AdamW.
            optimizer: InnerOptimizer::Muon,
        }
    }
}

impl TrainConfig {
    /// A model small enough for tests and examples (about 30k parameters, milliseconds per
    /// step).
    pub fn tiny(seed: u64) -> Self {
        let mut c = Self {
            seed,
            batch: 4,
            val_batches: 2,
            optimizer: InnerOptimizer::Adamw,
            ..Self::default()
        };
        c.model = ModelConfig::new()
            .with_d_model(32)
            .with_n_layers(1)
            .with_n_heads(2)
            .with_d_ff(64)
            .with_context(16);
        // The rate the tests' thresholds were set with.
        c.schedule.peak = 4e-3;
        c.schedule.warmup = 2;
        c.schedule.decay_steps = 100;
        c
    }

    /// Rejects settings that cannot train.
    pub fn validate(&self) -> Result<(), TrainError> {
        self.model.validate()?;
        let bad = |what: &str| Err(TrainError::Setting(what.to_owned()));
        if self.batch == 0 || self.batch > 4096 {
            return bad("batch must be between 1 and 4096");
        }
        if !(0.0..1.0).contains(&self.beta1) || !(0.0..1.0).contains(&self.beta2) {
            return bad("beta1 and beta2 must lie in [0, 1)");
        }
        if !(self.weight_decay >= 0.0 && self.clip_norm > 0.0) {
            return bad("weight_decay must be >= 0 and clip_norm > 0");
        }
        if self.val_every == 0 || self.val_batches == 0 {
            return bad("val_every and val_batches must be at least 1");
        }
        self.schedule.validate().map_err(TrainError::Setting)
    }

    /// Tokens processed by one inner step.
    pub fn tokens_per_step(&self) -> usize {
        self.batch * self.model.context
    }
}
