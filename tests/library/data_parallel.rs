//! Data-parallel arithmetic through the trainer's gradient hook: two trainers on shards
//! 0/2 and 1/2 that each apply the mean of their two gradients take the same steps as one
//! trainer on both batches at once (within floating-point noise), and stay identical; and
//! trainers made one after the other in one process start from the same weights.

use atoll::backend::Backend;
use atoll::data::{Batch, Corpus, Shard};
use atoll::fragment::FragmentPlan;
use atoll::model::params::{read_fragment, tensor_specs};
use atoll::train::{TrainConfig, Trainer};

fn params(t: &Trainer) -> Vec<f32> {
    let plan = FragmentPlan::new(&tensor_specs(t.model()), 1).unwrap();
    read_fragment(t.model(), &plan.fragments[0]).unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn concat(a: &Batch, b: &Batch) -> Batch {
    Batch {
        rows: a.rows + b.rows,
        context: a.context,
        inputs: [a.inputs.as_slice(), &b.inputs].concat(),
        targets: [a.targets.as_slice(), &b.targets].concat(),
    }
}

#[test]
fn two_peers_averaging_gradients_match_one_trainer_on_both_batches() {
    let corpus = Corpus::embedded().unwrap();
    let config = TrainConfig::tiny(9);
    let new = |shard| Trainer::new(config.clone(), Backend::default(), &corpus, shard).unwrap();
    let (mut a, mut b) = (new(Shard { index: 0, count: 2 }), new(Shard { index: 1, count: 2 }));
    let mut both = new(Shard::WHOLE);
    assert_eq!(params(&a), params(&both), "the trainers start from different weights");
    let mut moved = 0.0;
    for step in 0..5 {
        let (ba, bb) =
            (a.dataset().train_batch(step, 4).unwrap(), b.dataset().train_batch(step, 4).unwrap());
        // A's gradient first (no step: the hook refuses), then B steps on the mean, then A.
        let mut ga = Vec::new();
        let refused: Result<_, ()> = a.step_on(&ba, |g| {
            ga = g.clone();
            Err(())
        });
        assert!(refused.is_err());
        let mut mean = Vec::new();
        let sb = b
            .step_on(&bb, |g| {
                mean = ga.iter().zip(g.iter()).map(|(x, y)| (x + y) / 2.0).collect();
                g.clone_from(&mean);
                Ok::<_, ()>(())
            })
            .unwrap();
        let sa = a
            .step_on(&ba, |g| {
                assert_eq!(*g, ga, "the same batch gave another gradient");
                g.clone_from(&mean);
                Ok::<_, ()>(())
            })
            .unwrap();
        let s = both.step_on(&concat(&ba, &bb), |_| Ok::<_, ()>(())).unwrap();
        let mean_loss = (sa.loss.unwrap() + sb.loss.unwrap()) / 2.0;
        let loss = s.loss.unwrap();
        assert!((loss - mean_loss).abs() < 1e-4, "step {step}: loss {loss} vs {mean_loss}");
        assert_eq!(params(&a), params(&b), "step {step}: the two peers differ");
        let d = max_diff(&params(&a), &params(&both));
        // AdamW moves a parameter by about `lr` per step at most; float noise in the
        // summation order (two means of 4 rows vs one mean of 8) must stay a small part of it.
        moved += s.lr;
        assert!(
            d <= 0.02 * moved as f32,
            "step {step}: parameters differ by {d} (moved ≤ {moved})"
        );
    }
}

#[test]
fn an_identity_hook_is_a_plain_step() {
    let corpus = Corpus::embedded().unwrap();
    let config = TrainConfig::tiny(9);
    let new = || Trainer::new(config.clone(), Backend::default(), &corpus, Shard::WHOLE).unwrap();
    let (mut plain, mut hooked) = (new(), new());
    for _ in 0..5 {
        let p = plain.step().unwrap();
        let h = hooked.step_reduced(|_| Ok::<_, atoll::data::DataError>(())).unwrap();
        assert!(p.loss.is_some());
        assert_eq!(p.loss, h.loss);
    }
    assert_eq!(params(&plain), params(&hooked));
}
