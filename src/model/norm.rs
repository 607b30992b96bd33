//! Layer norm on the CPU backend. burn-nn's `LayerNorm` is burn's default decomposition
//! under autodiff (mean, subtract, square, mean, add, square root, divide, scale, shift):
//! nine passes over the activations forward, more backward, each recorded and freed. Here,
//! as a burn backend extension for Flex and autodiff over Flex, one row pass forward, which
//! keeps the normalised rows and each row's `1/σ`, and one backward:
//! `dx = (g - mean(g) - x̂ · mean(g · x̂)) / σ` with `g = dy · γ`, `dγ = Σ dy · x̂`, `dβ = Σ dy`,
//! the column sums taken over fixed chunks of rows and added in order, so the result does
//! not depend on the thread count. Other backends keep burn-nn's.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{backend_extension, Autodiff, Dispatch, Flex};
use burn::nn::LayerNorm;
use burn::tensor::{DType, Device, Tensor, TensorData};
use rayon::prelude::*;

use super::cpu::{f32_values, sum, vectorised, CHUNK, LANES};

/// `norm` over the last axis of `x`, with its `epsilon` (burn-nn keeps the module's
/// private, so the model passes the one it built it with): this module's kernel on Flex f32
/// with a bias, burn-nn's forward elsewhere.
pub fn layer_norm<const D: usize>(norm: &LayerNorm, x: Tensor<D>, epsilon: f32) -> Tensor<D> {
    let Some(beta) = norm.beta.as_ref().map(|b| b.val()) else {
        return norm.forward(x);
    };
    if x.device().inner() != Device::flex() || x.dtype() != DType::F32 {
        return norm.forward(x);
    }
    Tensor::from_dispatch(<Dispatch as NormOps>::fused_layer_norm(
        x.into_dispatch(),
        norm.gamma.val().into_dispatch(),
        beta.into_dispatch(),
        epsilon,
    ))
}

/// The extension: one operation, implemented for Flex and for autodiff over Flex.
#[backend_extension(Flex, Autodiff)]
pub trait NormOps: burn::backend::Backend {
    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f32,
    ) -> FloatTensor<Self>;
}

impl NormOps for Flex {
    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f32,
    ) -> FloatTensor<Self> {
        forward(x, gamma, beta, epsilon, false).0
    }
}

/// What the backward needs: `x̂`, each row's `1/σ`, and `γ`.
#[derive(Debug, Clone)]
struct Saved {
    normalised: FlexTensor,
    inverse_sigma: Vec<f32>,
    gamma: FlexTensor,
}

/// `y = x̂ · γ + β` row by row, and (if `keep`) what the backward needs.
fn forward(
    x: FlexTensor,
    gamma: FlexTensor,
    beta: FlexTensor,
    epsilon: f32,
    keep: bool,
) -> (FlexTensor, Option<Saved>) {
    let (Ok(x), Ok(gamma), Ok(beta)) = (f32_values(x), f32_values(gamma), f32_values(beta)) else {
        unreachable!("layer_norm passes f32 tensors only")
    };
    let d = gamma.layout().num_elements();
    let shape = x.layout().shape().clone();
    let g = &gamma.storage::<f32>()[gamma.layout().start_offset()..][..d];
    let b = &beta.storage::<f32>()[beta.layout().start_offset()..][..d];
    let (start, n) = (x.layout().start_offset(), x.layout().num_elements());
    let rows = n.checked_div(d).unwrap_or(0);
    let mut normalised = vec![0.0f32; if keep { n } else { 0 }];
    let mut inverse_sigma = vec![0.0f32; if keep { rows } else { 0 }];
    let mut out = FlexTensor::empty(shape.clone(), DType::F32);
    if let Some(rows_per_task) = CHUNK.checked_div(d) {
        let rows_per_task = rows_per_task.max(1);
        let chunk = rows_per_task * d;
        let xs = &x.storage::<f32>()[start..start + n];
        let ys = out.storage_mut::<f32>();
        let keep_chunks =
            normalised.par_chunks_mut(chunk).zip(inverse_sigma.par_chunks_mut(rows_per_task));
        let work = ys.par_chunks_mut(chunk).zip(xs.par_chunks(chunk));
        let row_pass = |(y, x): (&mut [f32], &[f32]),
                        mut kept: Option<(&mut [f32], &mut [f32])>| {
            vectorised(|| {
                for (r, (y, x)) in y.chunks_exact_mut(d).zip(x.chunks_exact(d)).enumerate() {
                    let mean = sum(x) / d as f32;
                    let var = sum_sq_dev(x, mean) / d as f32;
                    let inv = 1.0 / (var + epsilon).sqrt();
                    y.iter_mut().zip(x).for_each(|(y, &x)| *y = (x - mean) * inv);
                    if let Some((xhat, inv_s)) = kept.as_mut() {
                        xhat[r * d..][..d].copy_from_slice(y);
                        inv_s[r] = inv;
                    }
                    y.iter_mut().zip(g).zip(b).for_each(|((y, &g), &b)| *y = *y * g + b);
                }
            });
        };
        if keep {
            work.zip(keep_chunks).for_each(|(w, (xhat, inv_s))| row_pass(w, Some((xhat, inv_s))));
        } else {
            work.for_each(|w| row_pass(w, None));
        }
    }
    let saved = keep.then(|| Saved {
        normalised: FlexTensor::from_data(TensorData::new(normalised, shape)),
        inverse_sigma,
        gamma,
    });
    (out, saved)
}

/// The gradients of the layer norm.
#[derive(Debug)]
struct LayerNormBackward;

impl Backward<Flex, 3> for LayerNormBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_gamma, node_beta] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node);
        let (dx, dgamma, dbeta) = gradients(ops.state, grad);
        if let Some(node) = node_x {
            grads.register::<Flex>(node.id, dx);
        }
        if let Some(node) = node_gamma {
            grads.register::<Flex>(node.id, dgamma);
        }
        if let Some(node) = node_beta {
            grads.register::<Flex>(node.id, dbeta);
        }
    }
}

impl<C: CheckpointStrategy> NormOps for Autodiff<Flex, C> {
    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f32,
    ) -> FloatTensor<Self> {
        let nodes = [x.node(), gamma.node(), beta.node()];
        match LayerNormBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (y, saved) = forward(
                    x.into_primitive(),
                    gamma.into_primitive(),
                    beta.into_primitive(),
                    epsilon,
                    true,
                );
                prep.finish(saved.expect("kept"), y)
            }
            OpsKind::UnTracked(prep) => {
                let (x, g, b) = (x.into_primitive(), gamma.into_primitive(), beta.into_primitive());
                prep.finish(forward(x, g, b, epsilon, false).0)
            }
        }
    }
}

/// `dx`, `dγ` and `dβ` from the upstream gradient `dy`.
fn gradients(saved: Saved, dy: FlexTensor) -> (FlexTensor, FlexTensor, FlexTensor) {
    let Saved { normalised, inverse_sigma, gamma } = saved;
    let Ok(mut dy) = f32_values(dy) else { unreachable!("the gradient of an f32 tensor is f32") };
    let d = gamma.layout().num_elements();
    let gamma_shape = gamma.layout().shape().clone();
    let g = &gamma.storage::<f32>()[gamma.layout().start_offset()..][..d];
    let xhat = normalised.storage::<f32>();
    let (start, n) = (dy.layout().start_offset(), dy.layout().num_elements());
    let dys = &mut dy.storage_mut::<f32>()[start..start + n];
    let (mut dgamma, mut dbeta) = (vec![0.0f32; d], vec![0.0f32; d]);
    if let Some(rows_per_task) = CHUNK.checked_div(d) {
        let rows_per_task = rows_per_task.max(1);
        let chunk = rows_per_task * d;
        // Each chunk's column sums, then added in chunk order.
        let partials: Vec<(Vec<f32>, Vec<f32>)> = dys
            .par_chunks_mut(chunk)
            .zip(xhat.par_chunks(chunk))
            .zip(inverse_sigma.par_chunks(rows_per_task))
            .map(|((dy, xhat), inv)| {
                vectorised(|| {
                    let (mut dg, mut db) = (vec![0.0f32; d], vec![0.0f32; d]);
                    let rows = dy.chunks_exact_mut(d).zip(xhat.chunks_exact(d)).zip(inv);
                    for ((dy, xhat), &inv) in rows {
                        let (mut mean_g, mut mean_gx) = (0.0f32, 0.0f32);
                        for j in 0..d {
                            dg[j] += dy[j] * xhat[j];
                            db[j] += dy[j];
                            let gj = dy[j] * g[j];
                            mean_g += gj;
                            mean_gx += gj * xhat[j];
                        }
                        let (mean_g, mean_gx) = (mean_g / d as f32, mean_gx / d as f32);
                        for j in 0..d {
                            dy[j] = (dy[j] * g[j] - mean_g - xhat[j] * mean_gx) * inv;
                        }
                    }
                    (dg, db)
                })
            })
            .collect();
        for (dg, db) in partials {
            dgamma.iter_mut().zip(&dg).for_each(|(a, b)| *a += b);
            dbeta.iter_mut().zip(&db).for_each(|(a, b)| *a += b);
        }
    }
    let column = |v: Vec<f32>| FlexTensor::from_data(TensorData::new(v, gamma_shape.clone()));
    (dy, column(dgamma), column(dbeta))
}

/// `Σ (x - mean)²`, the same way.
#[inline(always)]
fn sum_sq_dev(xs: &[f32], mean: f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest: f32 = chunks.remainder().iter().map(|&x| (x - mean) * (x - mean)).sum();
    for c in chunks {
        lanes.iter_mut().zip(c).for_each(|(l, &x)| *l += (x - mean) * (x - mean));
    }
    lanes.iter().sum::<f32>() + rest
}

#[cfg(test)]
mod tests;
