//! GELU on the CPU backend: burn-flex computes `x · Φ(x)` and its gradient one value at a
//! time with libm's `erff` and `expf`, branchy code the compiler cannot vectorise, on one
//! thread — a fifth to a quarter of a default-model step (bench/RESULTS.md, "GELU's share of
//! the default model's step"). Here, as a burn backend extension for Flex and autodiff over
//! Flex, the same function in branch-free arithmetic the compiler vectorises (Abramowitz and
//! Stegun's 7.1.26 for `erf`, a range-reduced polynomial for `exp`), split over rayon's
//! threads. Within 4e-7 of the exact function and its derivative (the tests hold it to
//! that against f64), elementwise, so it gives the same bits on any thread count. Other
//! backends keep burn's own GELU.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{unary, Backward, Ops, OpsKind};
use burn::backend::autodiff::NodeId;
use burn::backend::flex::FlexTensor;
use burn::backend::ops::ActivationOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{backend_extension, Autodiff, Dispatch, Flex};
use burn::tensor::{Device, Tensor};
use rayon::prelude::*;

use super::cpu::{f32_values, vectorised, CHUNK};

/// `gelu(x)` on the training or inference device of `x`: the vectorised kernel on Flex,
/// burn's GELU elsewhere.
pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if x.device().inner() != Device::flex() {
        return burn::tensor::activation::gelu(x);
    }
    Tensor::from_dispatch(<Dispatch as GeluOps>::fast_gelu(x.into_dispatch()))
}

/// The extension: one operation, implemented for Flex and for autodiff over Flex.
#[backend_extension(Flex, Autodiff)]
pub trait GeluOps: burn::backend::Backend {
    fn fast_gelu(x: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl GeluOps for Flex {
    fn fast_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        match f32_values(x) {
            Ok(mut x) => {
                let (start, n) = (x.layout().start_offset(), x.layout().num_elements());
                let values = &mut x.storage_mut::<f32>()[start..start + n];
                values.par_chunks_mut(CHUNK).for_each(|c| {
                    vectorised(|| c.iter_mut().for_each(|v| *v = value(*v)));
                });
                x
            }
            Err(x) => <Flex as ActivationOps<Flex>>::gelu(x),
        }
    }
}

/// The gradient of GELU, kept with the input it needs.
#[derive(Debug)]
struct GeluBackward;

impl Backward<Flex, 1> for GeluBackward {
    type State = NodeId;

    fn backward(self, ops: Ops<NodeId, 1>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let input: FlexTensor = checkpointer.retrieve_node_output(ops.state);
        unary::<Flex, _>(ops.parents, ops.node, grads, |grad| gradient(input, grad));
    }
}

impl<C: CheckpointStrategy> GeluOps for Autodiff<Flex, C> {
    fn fast_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        match GeluBackward.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let state = prep.checkpoint(&x);
                // The input stays as it was for the backward: the kernel copies shared data.
                prep.finish(state, Flex::fast_gelu(x.primitive().clone()))
            }
            OpsKind::UnTracked(prep) => prep.finish(Flex::fast_gelu(x.into_primitive())),
        }
    }
}

/// `grad · gelu'(x)`, written over `grad` where it can be.
fn gradient(x: FlexTensor, grad: FlexTensor) -> FlexTensor {
    let same = x.layout().shape() == grad.layout().shape();
    match (same, f32_values(x), f32_values(grad)) {
        (true, Ok(x), Ok(mut grad)) => {
            let xs = &x.storage::<f32>()[x.layout().start_offset()..][..x.layout().num_elements()];
            let (start, n) = (grad.layout().start_offset(), grad.layout().num_elements());
            let gs = &mut grad.storage_mut::<f32>()[start..start + n];
            gs.par_chunks_mut(CHUNK).zip(xs.par_chunks(CHUNK)).for_each(|(g, x)| {
                vectorised(|| g.iter_mut().zip(x).for_each(|(g, &x)| *g *= derivative(x)));
            });
            grad
        }
        (_, x, grad) => {
            let (x, grad) = (x.unwrap_or_else(|t| t), grad.unwrap_or_else(|t| t));
            <Flex as ActivationOps<Flex>>::gelu_backward(x, grad)
        }
    }
}

const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// 1/√(2π).
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

/// `x · Φ(x)`.
#[inline(always)]
fn value(x: f32) -> f32 {
    let (cdf, _) = cdf_pdf(x);
    x * cdf
}

/// `gelu'(x) = Φ(x) + x · φ(x)`.
#[inline(always)]
fn derivative(x: f32) -> f32 {
    let (cdf, pdf) = cdf_pdf(x);
    cdf + x * pdf
}

/// `Φ(x)` and `φ(x)` of the standard normal, from one `exp(-x²/2)`. `erfc(z)` for `z ≥ 0`
/// is `t·(a₁ + t·(a₂ + …))·exp(-z²)` with `t = 1/(1 + p·z)` (Abramowitz and Stegun 7.1.26,
/// error ≤ 1.5e-7); `Φ(x)` is `erfc(|x|/√2)/2` for negative `x`, computed so, without the
/// cancellation of `(1 + erf)/2`, and `1 -` that otherwise.
#[inline(always)]
fn cdf_pdf(x: f32) -> (f32, f32) {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [0.254_829_6, -0.284_496_74, 1.421_413_8, -1.453_152, 1.061_405_4];
    let z = x.abs() * FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + P * z);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let e = exp_neg(z * z);
    let tail = 0.5 * poly * e;
    let cdf = if x < 0.0 { tail } else { 1.0 - tail };
    (cdf, FRAC_1_SQRT_2PI * e)
}

/// `exp(-y)` for `y ≥ 0` (NaN stays NaN): `2^k · e^r` with `k = round(-y / ln 2)` and `|r| ≤
/// ln 2 / 2`, `e^r` by its Taylor polynomial to `r⁶` (within 3e-7, relative); 0 beyond `y`
/// = 87, where `2^k` would leave the normal floats (so `x · φ(x)` is 0, not `x · 1e-38`).
#[inline(always)]
pub(super) fn exp_neg(y: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts, so `k · LN2_HI` is exact for the k used here.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 · 2²³: adding it rounds to an integer held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let v = -y.min(87.0);
    let k = v * LOG2E + ROUND;
    let kf = k - ROUND;
    let r = (v - kf * LN2_HI) - kf * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // k's integer sits in the low bits of its representation, offset by 0x4B40_0000.
    // Wrapping arithmetic (k is in [-126, 0], nothing wraps): an overflow check is a branch,
    // and a branch in the loop keeps it from being vectorised where the checks are on.
    let k = (k.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let scale = f32::from_bits((k.wrapping_add(127) as u32) << 23);
    let e = if y > 87.0 { 0.0 } else { p * scale };
    if y.is_nan() {
        y
    } else {
        e
    }
}

#[cfg(test)]
mod tests;
