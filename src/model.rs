//! The language model: a small decoder-only transformer over bytes, built from burn's own
//! modules (embedding, pre-norm transformer blocks with causal self-attention, layer norm,
//! linear head).
//!
//! Tokens are raw bytes (vocabulary 256): nothing to train or ship, every UTF-8 file is
//! valid input, and the loss in nats per token converts directly to bits per byte
//! (`val_bpb = loss / ln 2`), the number the metrics report.

mod attention;
mod cpu;
mod gelu;
mod norm;
pub mod params;

use burn::module::Module;
use burn::nn::activation::Activation as ActivationLayer;
use burn::nn::activation::ActivationConfig;
use burn::nn::attention::{generate_autoregressive_mask, MhaInput};
use burn::nn::loss::CrossEntropyLoss;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderLayer,
};
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::{Device, Int, Tensor};
use serde::{Deserialize, Serialize};

/// The layer norms' epsilon (burn-nn's default, named here because `LayerNorm` keeps its
/// own private and [`norm::layer_norm`] needs it).
const LAYER_NORM_EPS: f32 = 1e-5;

/// Number of distinct tokens: one per byte value.
pub const VOCAB_SIZE: usize = 256;

/// Shape of the model. Every peer of a run uses the same one (it is part of the manifest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Width of the residual stream.
    pub d_model: usize,
    /// Number of transformer blocks.
    pub n_layers: usize,
    /// Attention heads per block; must divide `d_model`.
    pub n_heads: usize,
    /// Hidden width of the feed-forward layer.
    pub d_ff: usize,
    /// Context length in tokens (bytes).
    pub context: usize,
    /// The feed-forward layer's activation. Left out of the manifest while it is GELU, so
    /// a manifest written before the setting existed keeps its run id.
    #[serde(default, skip_serializing_if = "Activation::is_gelu")]
    pub activation: Activation,
}

/// The feed-forward layer's activation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// `x · Φ(x)`. On the CPU backend (Flex) computed by [`gelu::gelu`], a vectorised
    /// kernel within 4e-7 of the exact function (burn-flex's own, one value at a time with
    /// `erf` and `exp`, took 20–28% of a default-model step); elsewhere by the backend.
    #[default]
    Gelu,
    /// `x · clamp(x/6 + ½, 0, 1)`: no transcendental function, 1.1–1.25× the default model's
    /// CPU throughput with the vectorised GELU (1.3–1.5× against burn-flex's); 1–3% higher
    /// val_bpb at equal steps (bench/RESULTS.md, "GELU's share of the default model's
    /// step", "A vectorised GELU on the CPU").
    HardSwish,
}

impl Activation {
    fn is_gelu(&self) -> bool {
        *self == Activation::Gelu
    }

    fn config(self) -> ActivationConfig {
        match self {
            Activation::Gelu => ActivationConfig::Gelu,
            Activation::HardSwish => ActivationConfig::HardSwish,
        }
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            d_model: 128,
            n_layers: 3,
            n_heads: 4,
            d_ff: 512,
            context: 64,
            activation: Activation::Gelu,
        }
    }
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
    /// The default model: width 128, 3 blocks of 4 heads, feed-forward 512, context 64, GELU.
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_d_model(self, d_model: usize) -> Self {
        Self { d_model, ..self }
    }

    pub fn with_n_layers(self, n_layers: usize) -> Self {
        Self { n_layers, ..self }
    }

    pub fn with_n_heads(self, n_heads: usize) -> Self {
        Self { n_heads, ..self }
    }

    pub fn with_d_ff(self, d_ff: usize) -> Self {
        Self { d_ff, ..self }
    }

    pub fn with_context(self, context: usize) -> Self {
        Self { context, ..self }
    }

    pub fn with_activation(self, activation: Activation) -> Self {
        Self { activation, ..self }
    }

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
                .with_layer_norm_eps(f64::from(LAYER_NORM_EPS))
                .with_activation(self.activation.config())
                .init(device);
        Lm {
            token_emb: EmbeddingConfig::new(VOCAB_SIZE, self.d_model).init(device),
            pos_emb: EmbeddingConfig::new(self.context, self.d_model).init(device),
            blocks,
            norm: LayerNormConfig::new(self.d_model)
                .with_epsilon(f64::from(LAYER_NORM_EPS))
                .init(device),
            head: LinearConfig::new(self.d_model, VOCAB_SIZE).init(device),
        }
    }
}

/// One of burn-nn's pre-norm encoder layers (`norm_first`: attention over `norm_2`'s output,
/// the feed-forward over `norm_1`'s, as `TransformerEncoderLayer::forward` has it; dropout
/// is 0 in this model and left out), with the attention computed by
/// [`attention::causal_self_attention`] and the feed-forward's GELU by [`gelu::gelu`] where
/// they can be (`mask` builds burn-nn's causal mask where they cannot): the parameters,
/// their names and records are burn-nn's.
fn block(
    layer: &TransformerEncoderLayer,
    x: Tensor<3>,
    mask: &dyn Fn() -> Tensor<3, burn::tensor::Bool>,
) -> Tensor<3> {
    let normed = norm::layer_norm(&layer.norm_2, x.clone(), LAYER_NORM_EPS);
    let context = attention::causal_self_attention(&layer.mha, &normed).unwrap_or_else(|| {
        layer.mha.forward(MhaInput::self_attn(normed).mask_attn(mask())).context
    });
    let x = x + context;
    let ff = &layer.pwff;
    let hidden =
        ff.linear_inner.forward(norm::layer_norm(&layer.norm_1, x.clone(), LAYER_NORM_EPS));
    let hidden = match &ff.activation {
        ActivationLayer::Gelu(g) if !g.approximate => gelu::gelu(hidden),
        other => other.forward(hidden),
    };
    x + ff.linear_outer.forward(hidden)
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
        let mask = || generate_autoregressive_mask(batch, time, &device);
        let x = self.blocks.layers.iter().fold(x, |x, layer| block(layer, x, &mask));
        self.head.forward(norm::layer_norm(&self.norm, x, LAYER_NORM_EPS))
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

    /// The model's own loop over burn-nn's layers computes what burn-nn's encoder does.
    #[test]
    fn the_blocks_compute_burns_encoder() {
        use burn::nn::transformer::TransformerEncoderInput;
        let device = Device::flex();
        device.seed(3);
        let config = ModelConfig::new().with_context(16);
        let model = config.init(&device);
        let tokens = Tensor::<2, Int>::from_data([[1, 200, 3, 7, 9, 65, 66, 10]], &device);
        let ours = model.forward(tokens.clone());
        let [batch, time] = tokens.dims();
        let positions = Tensor::<1, Int>::arange(0..time as i64, &device).reshape([1, time]);
        let x = model.token_emb.forward(tokens) + model.pos_emb.forward(positions);
        let mask = generate_autoregressive_mask(batch, time, &device);
        let x = model.blocks.forward(TransformerEncoderInput::new(x).mask_attn(mask));
        let theirs = model.head.forward(model.norm.forward(x));
        let tolerance = burn::tensor::Tolerance::<f32>::absolute(1e-5);
        ours.into_data().assert_approx_eq::<f32>(&theirs.into_data(), tolerance);
    }

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

    /// The activation is part of the model: the same weights with HardSwish give other
    /// logits; GELU stays out of the JSON (a manifest written before the setting keeps its
    /// run id), HardSwish round-trips, an unknown name or field is refused.
    #[test]
    fn activation_is_a_model_setting() {
        let device = crate::backend::Backend::Flex.device();
        let gelu = ModelConfig::new().with_context(8);
        let hard = gelu.clone().with_activation(Activation::HardSwish);
        let a = gelu.init(&device);
        let b = params::copy_params(&a, hard.init(&device)).unwrap();
        let tokens = || {
            let data = burn::tensor::TensorData::new(
                vec![72i64, 101, 108, 108, 111, 32, 119, 111],
                [1, 8],
            );
            Tensor::<2, Int>::from_data(data, &device)
        };
        let logits = |m: &Lm| m.forward(tokens()).into_data().try_to_vec::<f32>().unwrap();
        let (la, lb) = (logits(&a), logits(&b));
        let diff = la.iter().zip(&lb).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(diff > 1e-4, "HardSwish gave GELU's logits (max difference {diff})");
        assert_eq!(logits(&a), la, "the same model gives the same logits");

        let json = serde_json::to_value(&gelu).unwrap();
        assert!(json.get("activation").is_none(), "{json}");
        assert_eq!(serde_json::from_value::<ModelConfig>(json).unwrap(), gelu);
        let json = serde_json::to_value(&hard).unwrap();
        assert_eq!(json["activation"], "hard_swish");
        assert_eq!(serde_json::from_value::<ModelConfig>(json.clone()).unwrap(), hard);
        let mut bad = json.clone();
        bad["activation"] = "relu".into();
        assert!(serde_json::from_value::<ModelConfig>(bad).is_err());
        let mut bad = json;
        bad["activaton"] = "gelu".into();
        assert!(serde_json::from_value::<ModelConfig>(bad).is_err());
    }
}
