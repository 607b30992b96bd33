//! Micro-batches: one inner step's batch in several forward and backward passes.

use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::Tensor;

use super::{to_tensors, Trainer};
use crate::data::Batch;
use crate::model::Lm;

impl Trainer {
    /// Splits each step's batch into passes of at most `rows` rows whose gradients are
    /// summed before the one AdamW step (0, or `rows` ≥ the batch: one pass). The step is
    /// the same step up to float rounding — same tokens, same mean loss, same update — and
    /// autodiff keeps one pass's activations at a time instead of the whole batch's, which
    /// dominate a large model's memory ([`super::preset::memory_estimate`]). A local choice: it
    /// changes nothing another peer sees.
    pub fn set_micro_batch(&mut self, rows: usize) {
        self.micro_batch = rows;
    }

    /// Rows per pass, as [`Trainer::set_micro_batch`] set them (0: the whole batch).
    pub fn micro_batch(&self) -> usize {
        self.micro_batch
    }

    /// The batch's mean loss (detached) and its gradients: one pass, or one per
    /// micro-batch with each pass's loss weighed by its share of the rows.
    pub(super) fn gradients(&self, batch: &Batch) -> (Tensor<1>, GradientsParams) {
        let rows = batch.rows;
        let per = match self.micro_batch {
            0 => rows,
            m => m.min(rows),
        };
        if per >= rows {
            let (inputs, targets) = to_tensors(batch, &self.device);
            let loss = self.model.loss(inputs, targets);
            let detached = loss.clone().detach();
            return (detached, GradientsParams::from_grads(loss.backward(), &self.model));
        }
        let mut sum = GradientsAccumulator::<Lm>::new();
        let mut total = Tensor::<1>::zeros([1], &self.device);
        for start in (0..rows).step_by(per) {
            let part = batch.rows_slice(start..(start + per).min(rows));
            let (inputs, targets) = to_tensors(&part, &self.device);
            let share = part.rows as f32 / rows as f32;
            let loss = self.model.loss(inputs, targets).mul_scalar(share);
            total = total + loss.clone().detach();
            sum.accumulate(&self.model, GradientsParams::from_grads(loss.backward(), &self.model));
        }
        (total, sum.grads())
    }
}
