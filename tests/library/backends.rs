//! Every compiled backend trains the model (loss falls), and every one starts from the
//! same initial weights, bit for bit: peers on different backends share one run.

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
    let mut read = 0;
    for _ in 0..steps {
        let s = t.step().unwrap();
        assert!(s.loss.is_none_or(f32::is_finite));
        read += s.losses as usize;
    }
    // A CPU trainer reads every step's loss; a GPU one every GPU_LOSS_EVERY steps (a read
    // waits for the device), and the rest on demand.
    let every = if backend.is_gpu() { atoll::train::GPU_LOSS_EVERY as usize } else { 1 };
    assert_eq!(read, steps / every * every, "{backend}");
    let (rest, n) = t.read_loss();
    assert_eq!((rest.is_some(), read + n as usize), (steps % every > 0, steps), "{backend}");
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

#[test]
fn every_backend_starts_from_the_same_anchors() {
    let config = TrainConfig::tiny(11);
    let model = atoll::train::init_model(&config, &Backend::Flex.train_device());
    let plan =
        atoll::fragment::FragmentPlan::new(&atoll::model::params::tensor_specs(&model), 2).unwrap();
    let reference = atoll::node::initial_anchors(&config, &plan);
    assert!(reference.iter().flatten().any(|v| *v != 0.0));
    let corpus = Corpus::embedded().unwrap();
    for backend in usable() {
        // A fresh trainer on the backend holds the run's initial anchors, bit for bit.
        let t = Trainer::new(config.clone(), backend, &corpus, Shard::WHOLE).unwrap();
        let anchors: Vec<Vec<f32>> = plan
            .fragments
            .iter()
            .map(|f| atoll::model::params::read_fragment(t.model(), f).unwrap())
            .collect();
        let same = anchors
            .iter()
            .flatten()
            .map(|v| v.to_bits())
            .eq(reference.iter().flatten().map(|v| v.to_bits()));
        assert!(same, "{backend} starts from other weights than flex");
        check_backend_trains(backend);
    }
}

/// The compiled-in backends that run here. A GPU backend that cannot (no driver) is left
/// out, unless `ATOLL_REQUIRE_VULKAN` (CI) makes that a failure.
fn usable() -> Vec<Backend> {
    let usable = Backend::usable();
    if std::env::var_os("ATOLL_REQUIRE_VULKAN").is_some() {
        assert_eq!(usable, Backend::all(), "a compiled-in backend cannot run here");
    }
    usable
}

/// 40 steps on `backend` keep the loss finite and lower it (the GPU backends, when
/// compiled in, run here; the CPU ones have their own longer tests above).
fn check_backend_trains(backend: Backend) {
    if !backend.is_gpu() {
        return;
    }
    let (before, after) = train(backend, 40);
    assert!(after < before - 0.3, "{backend}: val loss {before:.3} -> {after:.3}");
}
