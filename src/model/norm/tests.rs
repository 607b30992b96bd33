use burn::nn::LayerNormConfig;
use burn::tensor::{Distribution, Tolerance};

use super::*;

/// burn-nn's layer norm and this one agree, forward and backward (the input's gradient,
/// γ's and β's), on rows of a width that is not a multiple of the lanes and on a view.
#[test]
fn the_kernel_matches_burns_layer_norm_forward_and_backward() {
    let device = Device::flex().autodiff();
    device.seed(9);
    let width = 37;
    let mut norm = LayerNormConfig::new(width).with_epsilon(1e-5).init(&device);
    // γ and β away from their initial ones and zeros, so their gradients are checked.
    let random = || Tensor::<1>::random([width], Distribution::Normal(1.0, 0.5), &device);
    norm.gamma = norm.gamma.clone().map(|_| random().require_grad());
    norm.beta = norm.beta.clone().map(|b| b.map(|_| random().require_grad()));
    let data =
        Tensor::<3>::random([4, 25, width], Distribution::Normal(3.0, 2.0), &device).into_data();
    let leaf = || Tensor::<3>::from_data(data.clone(), &device).require_grad();
    let (xa, xb) = (leaf(), leaf());
    let ours = layer_norm(&norm, xa.clone().swap_dims(0, 1), 1e-5);
    let theirs = norm.forward(xb.clone().swap_dims(0, 1));
    let tolerance = Tolerance::<f32>::absolute(2e-5);
    ours.clone().into_data().assert_approx_eq::<f32>(&theirs.clone().into_data(), tolerance);

    let weights = Tensor::<3>::random(ours.dims(), Distribution::Normal(0.0, 1.0), &device);
    let ga = (ours * weights.clone()).sum().backward();
    let gb = (theirs * weights).sum().backward();
    let x_grad = |g: &burn::tensor::Gradients, x: &Tensor<3>| x.grad(g).unwrap().into_data();
    x_grad(&ga, &xa).assert_approx_eq::<f32>(&x_grad(&gb, &xb), tolerance);
    let gamma = |g| norm.gamma.val().grad(g).unwrap().into_data();
    gamma(&ga).assert_approx_eq::<f32>(&gamma(&gb), Tolerance::<f32>::absolute(1e-4));
    let beta = |g| norm.beta.as_ref().unwrap().val().grad(g).unwrap().into_data();
    beta(&ga).assert_approx_eq::<f32>(&beta(&gb), Tolerance::<f32>::absolute(1e-4));
    // The forward left its input as it was.
    xa.into_data().assert_eq(&data, true);
}

/// Without autodiff too: each row comes out with mean β-weighted and unit spread.
#[test]
fn rows_are_normalised_without_autodiff() {
    let device = Device::flex();
    let norm = LayerNormConfig::new(4).init(&device);
    let x = Tensor::<2>::from_data([[1.0f32, 2.0, 3.0, 4.0], [-5.0, -5.0, -5.0, -5.0]], &device);
    let y = layer_norm(&norm, x, 1e-5).into_data().try_to_vec::<f32>().unwrap();
    let s = (1.25f32 + 1e-5).sqrt();
    let want = [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s, 0.0, 0.0, 0.0, 0.0];
    for (got, want) in y.iter().zip(want) {
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }
}
