//! Synchronous DiLoCo in one process: the reference atoll's swarm is measured against.
//!
//! `N` learners, each on its own shard with its own AdamW, take `H` inner steps from the
//! same anchor; then every fragment's outer deltas (`anchor − θ_i`, full precision) are
//! combined by the run's merge rule and bounds (`proto::merge::robust_step`: token
//! weights, RDA or mean, Nesterov) and the new anchor is written into every learner. No
//! network, no clock, no quantisation, no staleness: what is left of a quality gap between
//! this and the swarm is the price of being decoupled; what is left between this and
//! data-parallel training is DiLoCo's own (H, outer learning rate, momentum).
//!
//! The learners run one after the other on this thread; bytes are not measured but
//! computed as a ring all-reduce of f32 deltas would send them.

pub mod networked;

use crate::backend::Backend;
use crate::data::{Corpus, Shard};
use crate::delta::ContentHash;
use crate::fragment::{FragmentPlan, PlanError};
use crate::model::params::{read_fragment, tensor_specs, write_fragment, ParamsError};
use crate::proto::merge::{robust_step, Input};
use crate::proto::sampling::Sampling;
use crate::proto::{PeerId, Settings};
use crate::train::{TrainConfig, TrainError, Trainer};

/// Shape of a synchronous DiLoCo run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncDiloco {
    /// Learners (each trains shard `i/N`).
    pub learners: u32,
    /// Inner steps between two outer steps.
    pub h: u64,
    /// Inner steps per learner in all.
    pub steps: u64,
}

/// Where a run stands after an outer step.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// Inner steps per learner so far.
    pub step: u64,
    pub outer_steps: u64,
    /// Tokens over all learners so far.
    pub tokens: u64,
    /// Mean training loss of the last inner step of each learner.
    pub loss: f32,
    /// Validation loss (nats per byte) of the anchor, when this outer step crossed a
    /// multiple of `val_every` (and after the last one).
    pub val_loss: Option<f64>,
}

/// Why a baseline could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BaselineError {
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Params(#[from] ParamsError),
    #[error("a baseline needs at least one learner, one inner step per outer step and one step")]
    Shape,
    #[error(transparent)]
    Manifest(#[from] crate::manifest::ManifestError),
    #[error("run dir: {0}")]
    Io(#[from] std::io::Error),
    #[error("network: {0}")]
    Net(#[from] atoll_net::NetError),
    #[error(transparent)]
    Collective(#[from] crate::collective::CollectiveError),
    #[error("training stopped: {0}")]
    Stopped(String),
}

/// Runs synchronous DiLoCo; `progress` hears every outer step. Returns the last progress
/// (its `val_loss` is the final anchor's).
pub fn sync_diloco(
    train: &TrainConfig,
    settings: &Settings,
    corpus: &Corpus,
    backend: Backend,
    shape: SyncDiloco,
    mut progress: impl FnMut(&Progress),
) -> Result<Progress, BaselineError> {
    if shape.learners == 0 || shape.h == 0 || shape.steps == 0 {
        return Err(BaselineError::Shape);
    }
    let n = shape.learners;
    let mut learners = (0..n)
        .map(|index| Trainer::new(train.clone(), backend, corpus, Shard { index, count: n }))
        .collect::<Result<Vec<_>, _>>()?;
    let plan = FragmentPlan::new(&tensor_specs(learners[0].model()), settings.raw().fragments)?;
    // Every learner starts from the run's initial parameters, as every peer of a swarm does.
    let mut anchors = crate::node::initial_anchors(train, &plan);
    let mut momenta: Vec<Vec<f32>> = anchors.iter().map(|a| vec![0.0; a.len()]).collect();
    for learner in &mut learners {
        for (spec, anchor) in plan.fragments.iter().zip(&anchors) {
            write_fragment(learner.model_mut(), spec, anchor)?;
        }
    }
    let mut at = Progress { step: 0, outer_steps: 0, tokens: 0, loss: 0.0, val_loss: None };
    while at.step < shape.steps {
        let steps = shape.h.min(shape.steps - at.step);
        let mut tokens = Vec::with_capacity(learners.len());
        let mut loss = 0.0;
        for learner in &mut learners {
            let mut t = 0;
            for _ in 0..steps {
                let s = learner.step()?;
                t += s.tokens as u64;
                loss = s.loss.unwrap_or(loss);
            }
            tokens.push(t);
            at.loss += loss;
        }
        at.loss /= n as f32;
        for (spec, (anchor, momentum)) in
            plan.fragments.iter().zip(anchors.iter_mut().zip(&mut momenta))
        {
            let deltas = learners
                .iter()
                .map(|l| {
                    let theta = read_fragment(l.model(), spec)?;
                    Ok(anchor.iter().zip(theta).map(|(a, t)| a - t).collect::<Vec<f32>>())
                })
                .collect::<Result<Vec<_>, ParamsError>>()?;
            let mut inputs: Vec<Input<'_>> = deltas
                .iter()
                .enumerate()
                .map(|(i, values)| Input {
                    hash: ContentHash(*blake3::hash(&(i as u64).to_le_bytes()).as_bytes()),
                    author: PeerId(i as u64),
                    tokens: tokens[i],
                    steps,
                    values,
                })
                .collect();
            crate::proto::merge::canonical_order(&mut inputs);
            let plain = Sampling::default().outer(settings.raw());
            let step = robust_step(spec, &mut inputs, anchor, momentum, settings, plain);
            (*anchor, *momentum) = (step.anchor, step.momentum);
            for learner in &mut learners {
                write_fragment(learner.model_mut(), spec, anchor)?;
            }
        }
        let before = at.step;
        at.step += steps;
        at.outer_steps += 1;
        at.tokens += tokens.iter().sum::<u64>();
        let every = train.val_every.max(1);
        let crossed = at.step / every > before / every || at.step == shape.steps;
        at.val_loss = crossed.then(|| learners[0].evaluate());
        progress(&at);
        at.loss = 0.0;
    }
    Ok(at)
}

/// Bytes one learner sends in a ring all-reduce of `values` f32 values over `learners`:
/// `2 (N − 1) / N × 4 × values`.
pub fn ring_allreduce_bytes(learners: u32, values: usize) -> u64 {
    let n = u64::from(learners.max(1));
    2 * (n - 1) * 4 * values as u64 / n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{MergeRule, RawSettings};

    #[test]
    fn one_learner_with_outer_lr_one_and_no_momentum_is_solo_training() {
        let corpus = Corpus::embedded().unwrap();
        let mut train = TrainConfig::tiny(5);
        train.val_every = 1_000;
        let raw = RawSettings {
            outer_lr: 1.0,
            momentum: 0.0,
            merge: MergeRule::Mean,
            // The outer optimizer's arithmetic alone: without momentum the state's buffer
            // is the last delta, which the defences against a lone hostile delta would
            // hold the next one against (`merge::cap_to_momentum`).
            agreement_weights: false,
            ..crate::manifest::default_protocol()
        };
        let settings = Settings::new(raw).unwrap();
        let shape = SyncDiloco { learners: 1, h: 5, steps: 30 };
        let mut solo =
            Trainer::new(train.clone(), Backend::default(), &corpus, Shard::WHOLE).unwrap();
        let specs = tensor_specs(solo.model());
        let plan = FragmentPlan::new(&specs, settings.raw().fragments).unwrap();
        let init = crate::node::initial_anchors(&train, &plan);
        for (spec, values) in plan.fragments.iter().zip(&init) {
            write_fragment(solo.model_mut(), spec, values).unwrap();
        }
        let mut solo_losses = Vec::new();
        let mut outer_losses = Vec::new();
        let end = sync_diloco(&train, &settings, &corpus, Backend::default(), shape, |p| {
            outer_losses.push(p.loss);
        })
        .unwrap();
        for step in 1..=30 {
            let s = solo.step().unwrap();
            if step % 5 == 0 {
                solo_losses.push(s.loss.unwrap());
            }
        }
        assert_eq!(end.outer_steps, 6);
        assert_eq!(end.tokens, solo.state().tokens);
        for (i, (a, b)) in outer_losses.iter().zip(&solo_losses).enumerate() {
            assert!((a - b).abs() < 1e-4, "outer step {i}: loss {a} vs solo {b}");
        }
        let (a, b) = (end.val_loss.unwrap(), solo.evaluate());
        assert!((a - b).abs() < 1e-4, "final val loss {a} vs solo {b}");
    }

    #[test]
    fn learners_on_different_shards_move_the_anchor_together() {
        let corpus = Corpus::embedded().unwrap();
        let mut train = TrainConfig::tiny(5);
        train.val_every = 10;
        let settings = Settings::new(crate::manifest::default_protocol()).unwrap();
        let shape = SyncDiloco { learners: 3, h: 5, steps: 20 };
        let mut seen = Vec::new();
        let end = sync_diloco(&train, &settings, &corpus, Backend::default(), shape, |p| {
            seen.push(p.clone())
        })
        .unwrap();
        assert_eq!(seen.len(), 4);
        assert_eq!(end.tokens, 3 * 20 * train.tokens_per_step() as u64);
        assert_eq!(
            seen.iter().filter(|p| p.val_loss.is_some()).count(),
            2,
            "val at steps 10 and 20"
        );
        let (first, last) = (seen[1].val_loss.unwrap(), end.val_loss.unwrap());
        assert!(last.is_finite() && last < first + 0.5, "val loss {first} → {last}");
        assert_eq!(ring_allreduce_bytes(4, 1000), 6000);
        assert_eq!(ring_allreduce_bytes(1, 1000), 0);
    }
}
