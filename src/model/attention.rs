//! Causal attention weights on the CPU backend. burn-nn's attention scales the scores, fills
//! the future with -10⁴ and takes burn's softmax, which autodiff records as its default
//! decomposition (max, subtract, `exp`, sum, divide): five operations forward and more
//! backward, each a pass over `[batch, heads, time, time]` values, `exp` one value at a
//! time through libm (whose underflow path every masked value takes). Here, as a burn
//! backend extension for Flex and autodiff over Flex, one row-wise pass forward and one
//! backward: `y = softmax(scale · x)` over the columns `j ≤ i` of row `i`, 0 beyond, and
//! `dx = scale · y · (dy - Σ dy·y)`. Each row is computed alone, in a fixed order, so the
//! result does not depend on the thread count. Other backends keep burn-nn's attention.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{unary, Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{backend_extension, Autodiff, Dispatch, Flex};
use burn::nn::attention::MultiHeadAttention;
use burn::nn::Linear;
use burn::tensor::{DType, Device, Tensor};
use rayon::prelude::*;

use super::cpu::{dot, f32_values, sum, vectorised, CHUNK};
use super::gelu::exp_neg;

/// Causal self-attention of `mha` over `x` (`[batch, time, d_model]`), as
/// `MultiHeadAttention::forward` computes it with burn-nn's autoregressive mask, or `None`
/// where this module does not compute it (another device or dtype, dropout, quiet softmax):
/// the caller then runs burn-nn's.
pub fn causal_self_attention(mha: &MultiHeadAttention, x: &Tensor<3>) -> Option<Tensor<3>> {
    let usable = x.device().inner() == Device::flex()
        && x.dtype() == DType::F32
        && mha.dropout.prob == 0.0
        && !mha.quiet_softmax;
    if !usable {
        return None;
    }
    let [batch, time, d_model] = x.dims();
    let heads = |linear: &Linear| {
        linear.forward(x.clone()).reshape([batch, time, mha.n_heads, mha.d_k]).swap_dims(1, 2)
    };
    let (query, key, value) = (heads(&mha.query), heads(&mha.key), heads(&mha.value));
    let scores = query.matmul(key.transpose());
    let weights = causal_softmax(scores, 1.0 / (mha.d_k as f32).sqrt());
    let context = weights.matmul(value).swap_dims(1, 2).reshape([batch, time, d_model]);
    Some(mha.output.forward(context))
}

/// `softmax(scale · x)` along the last axis over the columns `j ≤ i` of each row `i` (its
/// index along the second-to-last axis), 0 in the others. Flex f32 tensors only (see
/// [`causal_self_attention`]); `scale` positive.
fn causal_softmax(scores: Tensor<4>, scale: f32) -> Tensor<4> {
    Tensor::from_dispatch(<Dispatch as AttentionOps>::causal_softmax(scores.into_dispatch(), scale))
}

/// The extension: one operation, implemented for Flex and for autodiff over Flex.
#[backend_extension(Flex, Autodiff)]
pub trait AttentionOps: burn::backend::Backend {
    fn causal_softmax(scores: FloatTensor<Self>, scale: f32) -> FloatTensor<Self>;
}

impl AttentionOps for Flex {
    fn causal_softmax(scores: FloatTensor<Self>, scale: f32) -> FloatTensor<Self> {
        let Ok(mut scores) = f32_values(scores) else {
            unreachable!("causal_self_attention passes f32 tensors only")
        };
        let shape = scores.layout().shape().to_vec();
        let (rows, cols) = matrix_shape(&shape);
        let (start, n) = (scores.layout().start_offset(), scores.layout().num_elements());
        let values = &mut scores.storage_mut::<f32>()[start..start + n];
        if let Some(rows_per_task) = CHUNK.checked_div(cols) {
            let rows_per_task = rows_per_task.max(1);
            values.par_chunks_mut(rows_per_task * cols).enumerate().for_each(|(task, chunk)| {
                vectorised(|| {
                    for (r, row) in chunk.chunks_exact_mut(cols).enumerate() {
                        let i = (task * rows_per_task + r) % rows;
                        softmax_row(row, i + 1, scale);
                    }
                });
            });
        }
        scores
    }
}

/// Rows per matrix and columns of a `[.., rows, cols]` shape.
fn matrix_shape(shape: &[usize]) -> (usize, usize) {
    match shape {
        [.., rows, cols] => ((*rows).max(1), *cols),
        [cols] => (1, *cols),
        [] => (1, 1),
    }
}

/// The gradient of the causal softmax, kept with the weights it needs.
#[derive(Debug)]
struct CausalSoftmaxBackward;

impl Backward<Flex, 1> for CausalSoftmaxBackward {
    type State = (FlexTensor, f32);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (weights, scale) = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |grad| gradient(weights, grad, scale));
    }
}

impl<C: CheckpointStrategy> AttentionOps for Autodiff<Flex, C> {
    fn causal_softmax(scores: FloatTensor<Self>, scale: f32) -> FloatTensor<Self> {
        match CausalSoftmaxBackward.prepare::<C>([scores.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let weights = Flex::causal_softmax(scores.into_primitive(), scale);
                prep.finish((weights.clone(), scale), weights)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(Flex::causal_softmax(scores.into_primitive(), scale))
            }
        }
    }
}

/// `scale · y · (dy - Σ dy·y)` row by row, written over `grad` where it can be.
fn gradient(weights: FlexTensor, grad: FlexTensor, scale: f32) -> FlexTensor {
    let (Ok(y), Ok(mut grad)) = (f32_values(weights), f32_values(grad)) else {
        unreachable!("the weights and their gradient are f32")
    };
    let shape = y.layout().shape().to_vec();
    let (_, cols) = matrix_shape(&shape);
    let ys = &y.storage::<f32>()[y.layout().start_offset()..][..y.layout().num_elements()];
    let (start, n) = (grad.layout().start_offset(), grad.layout().num_elements());
    let gs = &mut grad.storage_mut::<f32>()[start..start + n];
    if let Some(rows_per_task) = CHUNK.checked_div(cols) {
        let chunk = rows_per_task.max(1) * cols;
        gs.par_chunks_mut(chunk).zip(ys.par_chunks(chunk)).for_each(|(g, y)| {
            vectorised(|| {
                for (g, y) in g.chunks_exact_mut(cols).zip(y.chunks_exact(cols)) {
                    let dot = dot(g, y);
                    g.iter_mut().zip(y).for_each(|(g, &y)| *g = scale * y * (*g - dot));
                }
            });
        });
    }
    grad
}

/// One row: `softmax(scale · row[..kept])`, zeros after.
#[inline(always)]
fn softmax_row(row: &mut [f32], kept: usize, scale: f32) {
    let kept = kept.min(row.len());
    let (head, tail) = row.split_at_mut(kept);
    tail.iter_mut().for_each(|v| *v = 0.0);
    let max = head.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    head.iter_mut().for_each(|v| *v = exp_neg(scale * (max - *v)));
    let inverse = 1.0 / sum(head);
    head.iter_mut().for_each(|v| *v *= inverse);
}

#[cfg(test)]
mod tests;
