use burn::tensor::{Distribution, Tensor, TensorData};

use super::*;

fn exact(x: f64) -> (f64, f64) {
    let cdf = 0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2));
    let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    (x * cdf, cdf + x * pdf)
}

/// Every f32 step of 1/256 in [-12, 12], and beyond.
fn grid() -> Vec<f32> {
    let mut xs: Vec<f32> = (-3072..=3072).map(|i| i as f32 / 256.0).collect();
    xs.extend([-1e30, -100.0, -87.5, -20.0, 20.0, 87.5, 100.0, 1e30, f32::MIN_POSITIVE, -0.0]);
    xs
}

#[test]
fn value_and_derivative_are_within_4e7_of_the_exact_function() {
    let (mut worst_value, mut worst_slope) = (0.0f64, 0.0f64);
    for x in grid() {
        let (v, d) = exact(f64::from(x));
        // Relative to the value's own size where it is large (x itself, for large x).
        worst_value = worst_value.max((f64::from(value(x)) - v).abs() / v.abs().max(1.0));
        worst_slope = worst_slope.max((f64::from(derivative(x)) - d).abs());
    }
    assert!(worst_value < 4e-7, "value off by {worst_value:e}");
    assert!(worst_slope < 4e-7, "derivative off by {worst_slope:e}");
    assert!(value(f32::NAN).is_nan() && derivative(f32::NAN).is_nan());
    assert_eq!((value(f32::INFINITY), derivative(1e30)), (f32::INFINITY, 1.0));
    assert_eq!((value(-1e30), derivative(-1e30)), (0.0, 0.0));
}

#[test]
fn exp_of_a_negative_argument_is_within_3e7_relative() {
    for i in 0..=8700 {
        let y = i as f32 / 100.0;
        let want = (-f64::from(y)).exp();
        let got = f64::from(exp_neg(y));
        assert!((got - want).abs() <= 3e-7 * want, "exp(-{y}) = {got:e}, want {want:e}");
    }
    assert_eq!(exp_neg(88.0), 0.0);
    assert!(exp_neg(f32::NAN).is_nan());
}

/// The backend's GELU and this one agree on a tensor, forward and backward, on views too;
/// and a tensor used twice keeps its values (the kernel writes in place only into data it
/// owns).
#[test]
fn the_kernel_matches_burns_gelu_forward_and_backward() {
    let device = Device::flex().autodiff();
    device.seed(7);
    let data = Tensor::<2>::random([96, 130], Distribution::Normal(0.0, 3.0), &device).into_data();
    let leaf = || Tensor::<2>::from_data(data.clone(), &device).require_grad();
    let (xa, xb) = (leaf(), leaf());
    // Transposed views: not contiguous.
    let ours = gelu(xa.clone().transpose());
    let theirs = burn::tensor::activation::gelu(xb.clone().transpose());
    ours.clone()
        .into_data()
        .assert_approx_eq::<f32>(&theirs.clone().into_data(), Default::default());
    // Same upstream gradient through each.
    let weights = Tensor::<2>::random([130, 96], Distribution::Default, &device);
    let g_ours = (ours * weights.clone()).sum().backward();
    let g_theirs = (theirs * weights).sum().backward();
    let (a, b) = (xa.grad(&g_ours).unwrap(), xb.grad(&g_theirs).unwrap());
    a.into_data().assert_approx_eq::<f32>(&b.into_data(), Default::default());
    // The forward left its input as it was.
    xa.into_data().assert_eq(&data, true);
    // Without autodiff too, and elsewhere burn's own.
    let plain = Tensor::<1>::from_data(TensorData::from([-2.0f32, 0.0, 0.5, 3.0]), &Device::flex());
    let want: Vec<f32> = [-2.0f64, 0.0, 0.5, 3.0].iter().map(|&x| exact(x).0 as f32).collect();
    gelu(plain)
        .into_data()
        .assert_approx_eq::<f32>(&TensorData::from(want.as_slice()), Default::default());
}
