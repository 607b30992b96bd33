//! The language model: a small decoder-only transformer over bytes, built from burn's own
//! modules (embedding, pre-norm transformer blocks with causal self-attention, layer norm,
//! linear head).
//!
//! Tokens are raw bytes (vocabulary 256): nothing to train or ship, every UTF-8 file is
//! valid input, and the loss in nats per token converts directly to bits per byte
//! (`val_bpb = loss / ln 2`), the number the metrics report.

pub mod params;

use burn::config::Config;
use burn::module::Module;
use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::loss::CrossEntropyLoss;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::{Device, Int, Tensor};

/// Number of distinct tokens: one per byte value.
pub const VOCAB_SIZE: usize = 256;

/// Shape of the model. Every peer of a run uses the same one (it is part of the manifest).
#[derive(Config, Debug, PartialEq)]
pub struct ModelConfig {
    /// Width of the residual stream.
    #[config(default = 128)]
    pub d_model: usize,
    /// Number of transformer blocks.
    #[config(default = 3)]
    pub n_layers: usize,
    /// Attention heads per block; must divide `d_model`.
    #[config(default = 4)]
    pub n_heads: usize,
    /// Hidden width of the feed-forward layer.
    #[config(default = 512)]
    pub d_ff: usize,
    /// Context length in tokens (bytes).
    #[config(default = 64)]
    pub context: usize,
}

/// A model configuration that makes no sense.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelConfigError {
    #[error("model field `{0}` must be at least 1")]
    Zero(&'static str),
    #[error("d_model ({d_model}) must be a multiple of n_heads ({n_heads})")]
    HeadsDoNotDivide { d_model: usize, n_heads: usize },
    #[error("model field `{field}` is {value}, above the limit {limit}")]
    TooLarge { field: &'static str, value: usize, limit: usize },
}

impl ModelConfig {
    /// Rejects shapes that would fail inside burn or exhaust memory, with a clear message.
    pub fn validate(&self) -> Result<(), ModelConfigError> {
        let fields = [
            ("d_model", self.d_model, 8192),
            ("n_layers", self.n_layers, 256),
            ("n_heads", self.n_heads, 256),
            ("d_ff", self.d_ff, 65536),
            ("context", self.context, 16384),
        ];
        for (field, value, limit) in fields {
            if value == 0 {
                return Err(ModelConfigError::Zero(field));
            }
            if value > limit {
                return Err(ModelConfigError::TooLarge { field, value, limit });
            }
        }
        if self.d_model % self.n_heads != 0 {
            return Err(ModelConfigError::HeadsDoNotDivide {
                d_model: self.d_model,
                n_heads: self.n_heads,
            });
        }
        Ok(())
    }

    /// Builds a freshly initialised model on `device` (seed the device first for
    /// reproducible weights).
    pub fn init(&self, device: &Device) -> Lm {
        let blocks =
            TransformerEncoderConfig::new(self.d_model, self.d_ff, self.n_heads, self.n_layers)
                .with_dropout(0.0)
                .with_norm_first(true)
                .init(device);
        Lm {
            token_emb: EmbeddingConfig::new(VOCAB_SIZE, self.d_model).init(device),
            pos_emb: EmbeddingConfig::new(self.context, self.d_model).init(device),
            blocks,
            norm: LayerNormConfig::new(self.d_model).init(device),
            head: LinearConfig::new(self.d_model, VOCAB_SIZE).init(device),
        }
    }
}

/// The decoder-only transformer language model.
#[derive(Module, Debug)]
pub struct Lm {
    /// Byte embedding (merged with a plain weighted mean, see `crate::fragment`).
    pub token_emb: Embedding,
    /// Learned absolute position embedding, one row per context position.
    pub pos_emb: Embedding,
    /// Pre-norm blocks with causal self-attention.
    pub blocks: TransformerEncoder,
    /// Final layer norm before the head.
    pub norm: LayerNorm,
    /// Projection to byte logits.
    pub head: Linear,
}

impl Lm {
    /// Logits `[batch, time, VOCAB_SIZE]` for byte tokens `[batch, time]`, `time <= context`.
    pub fn forward(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        let device = tokens.device();
        let [batch, time] = tokens.dims();
        let positions = Tensor::<1, Int>::arange(0..time as i64, &device).reshape([1, time]);
        let x = self.token_emb.forward(tokens) + self.pos_emb.forward(positions);
        let mask = generate_autoregressive_mask(batch, time, &device);
        let x = self.blocks.forward(TransformerEncoderInput::new(x).mask_attn(mask));
        self.head.forward(self.norm.forward(x))
    }

    /// Mean next-byte cross-entropy (nats per token) of `inputs` predicting `targets`.
    pub fn loss(&self, inputs: Tensor<2, Int>, targets: Tensor<2, Int>) -> Tensor<1> {
        let device = inputs.device();
        let [batch, time] = inputs.dims();
        let logits = self.forward(inputs).reshape([batch * time, VOCAB_SIZE]);
        CrossEntropyLoss::new(None, &device).forward(logits, targets.reshape([batch * time]))
    }

    /// Context length the model was built for.
    pub fn context(&self) -> usize {
        self.pos_emb.weight.dims()[0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_rejects_nonsense() {
        let ok = ModelConfig::new();
        assert_eq!(ok.validate(), Ok(()));
        assert_eq!(
            ModelConfig::new().with_n_layers(0).validate(),
            Err(ModelConfigError::Zero("n_layers"))
        );
        assert!(matches!(
            ModelConfig::new().with_d_model(130).validate(),
            Err(ModelConfigError::HeadsDoNotDivide { .. })
        ));
        assert!(matches!(
            ModelConfig::new().with_context(1 << 20).validate(),
            Err(ModelConfigError::TooLarge { field: "context", .. })
        ));
    }
}
