//! Text generation: sample bytes one at a time from the model's next-byte distribution.

use burn::tensor::activation::softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::model::Lm;

/// Generates `len` bytes after `prompt` with temperature `temperature` (seeded, so the same
/// model, prompt and seed give the same text). Returns only the new bytes.
pub fn generate(
    model: &Lm,
    device: &Device,
    prompt: &[u8],
    len: usize,
    temperature: f64,
    seed: u64,
) -> Vec<u8> {
    let context = model.context();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut text: Vec<u8> = if prompt.is_empty() { b"\n".to_vec() } else { prompt.to_vec() };
    let start = text.len();
    let temperature = temperature.max(1e-3);
    for _ in 0..len {
        let window = &text[text.len().saturating_sub(context)..];
        let tokens: Vec<i64> = window.iter().map(|&b| i64::from(b)).collect();
        let input = Tensor::<2, Int>::from_data(TensorData::new(tokens, [1, window.len()]), device);
        let logits = model.forward(input);
        let [_, time, vocab] = logits.dims();
        let last = logits.slice([0..1, time - 1..time, 0..vocab]).reshape([vocab]);
        let probs = softmax(last.div_scalar(temperature), 0)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap_or_default();
        text.push(pick(&probs, rng.random::<f32>()));
    }
    text.split_off(start)
}

/// The index where the cumulative distribution first exceeds `u` (`u` in `[0, 1)`).
fn pick(probs: &[f32], u: f32) -> u8 {
    let mut acc = 0.0;
    for (i, &p) in probs.iter().enumerate() {
        acc += p;
        if u < acc {
            return i as u8;
        }
    }
    probs.len().saturating_sub(1) as u8
}

#[cfg(test)]
mod tests {
    #[test]
    fn pick_follows_the_cumulative_distribution() {
        let probs = [0.1, 0.0, 0.6, 0.3];
        assert_eq!(super::pick(&probs, 0.05), 0);
        assert_eq!(super::pick(&probs, 0.1), 2);
        assert_eq!(super::pick(&probs, 0.69), 2);
        assert_eq!(super::pick(&probs, 0.71), 3);
        assert_eq!(super::pick(&probs, 0.9999), 3);
    }
}
