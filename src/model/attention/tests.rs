use burn::nn::attention::{generate_autoregressive_mask, MhaInput, MultiHeadAttentionConfig};
use burn::tensor::{Distribution, Tolerance};
use rand::{Rng, SeedableRng};

use super::*;

/// `softmax(scale · row[..kept])` in f64, zeros after.
fn exact(row: &[f32], kept: usize, scale: f64) -> Vec<f64> {
    let head = &row[..kept];
    let max = head.iter().map(|&x| f64::from(x)).fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = head.iter().map(|&x| (scale * (f64::from(x) - max)).exp()).collect();
    let total: f64 = e.iter().sum();
    e.iter().map(|v| v / total).chain(std::iter::repeat_n(0.0, row.len() - kept)).collect()
}

#[test]
fn a_row_is_the_softmax_of_its_first_columns_and_zero_after() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for len in [1usize, 2, 7, 8, 9, 31, 64, 100] {
        for kept in [1, len / 2 + 1, len] {
            let row: Vec<f32> = (0..len).map(|_| rng.random_range(-40.0..40.0)).collect();
            let mut ours = row.clone();
            softmax_row(&mut ours, kept, 0.25);
            let want = exact(&row, kept, 0.25);
            for (j, (&o, &w)) in ours.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(o) - w).abs() < 1e-6,
                    "len {len} kept {kept} col {j}: {o} vs {w}"
                );
                if j >= kept {
                    assert_eq!(o, 0.0);
                }
            }
            let total: f32 = ours.iter().sum();
            assert!((total - 1.0).abs() < 1e-5, "row sums to {total}");
        }
    }
    // A NaN score spoils its row rather than vanishing.
    let mut row = vec![0.0, f32::NAN, 1.0];
    softmax_row(&mut row, 3, 1.0);
    assert!(row.iter().all(|v| v.is_nan()));
}

/// burn-nn's attention with its autoregressive mask and this one agree, forward and
/// backward (the input's gradient and a projection's), with several heads and a batch.
#[test]
fn the_kernel_matches_burns_masked_attention_forward_and_backward() {
    let device = Device::flex().autodiff();
    device.seed(5);
    let (batch, time, d_model) = (3, 21, 32);
    let mha = MultiHeadAttentionConfig::new(d_model, 4).with_dropout(0.0).init(&device);
    let data = Tensor::<3>::random([batch, time, d_model], Distribution::Normal(0.0, 2.0), &device)
        .into_data();
    let leaf = || Tensor::<3>::from_data(data.clone(), &device).require_grad();
    let (xa, xb) = (leaf(), leaf());
    let ours = causal_self_attention(&mha, &xa).expect("flex f32 without dropout");
    let mask = generate_autoregressive_mask(batch, time, &device);
    let theirs = mha.forward(MhaInput::self_attn(xb.clone()).mask_attn(mask)).context;
    let tolerance = Tolerance::<f32>::absolute(1e-5);
    ours.clone().into_data().assert_approx_eq::<f32>(&theirs.clone().into_data(), tolerance);

    // A loss that weighs every output differently.
    let weights =
        Tensor::<3>::random([batch, time, d_model], Distribution::Normal(0.0, 1.0), &device);
    let ga = (ours * weights.clone()).sum().backward();
    let gb = (theirs * weights).sum().backward();
    let grad = |g: &burn::tensor::Gradients, x: &Tensor<3>| x.grad(g).unwrap().into_data();
    grad(&ga, &xa).assert_approx_eq::<f32>(&grad(&gb, &xb), tolerance);
    let wq = |g| mha.query.weight.val().grad(g).unwrap().into_data();
    wq(&ga).assert_approx_eq::<f32>(&wq(&gb), tolerance);
}

/// Where the kernel does not apply, the caller is told to run burn-nn's attention.
#[test]
fn dropout_or_quiet_softmax_leave_it_to_burn() {
    let device = Device::flex();
    let x = Tensor::<3>::zeros([1, 4, 8], &device);
    let with = |config: MultiHeadAttentionConfig| causal_self_attention(&config.init(&device), &x);
    assert!(with(MultiHeadAttentionConfig::new(8, 2).with_dropout(0.0)).is_some());
    assert!(with(MultiHeadAttentionConfig::new(8, 2).with_dropout(0.1)).is_none());
    let quiet = MultiHeadAttentionConfig::new(8, 2).with_dropout(0.0).with_quiet_softmax(true);
    assert!(with(quiet).is_none());
}
