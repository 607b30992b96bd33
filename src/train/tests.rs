//! The trainer's micro-batches: the same step in passes.

use super::*;
use crate::data::Shard;

fn trainer(rows: usize) -> Trainer {
    let corpus = Corpus::embedded().unwrap();
    let config = TrainConfig::tiny(7);
    let mut t = Trainer::new(config, Backend::default(), &corpus, Shard::WHOLE).unwrap();
    t.set_micro_batch(rows);
    t
}

/// The loss and the flat gradient of `t`'s next batch, without stepping.
fn loss_and_gradient(t: &Trainer) -> (f32, Vec<f32>) {
    let batch = t.data.train_batch(t.state.step, t.config.batch).unwrap();
    let (loss, mut grads) = t.gradients(&batch);
    let (mut flat, mut layout) = (Vec::new(), Vec::new());
    t.model.visit(&mut grad_io::Take { grads: &mut grads, flat: &mut flat, layout: &mut layout });
    (loss.into_scalar::<f32>(), flat)
}

/// Passes of one row, and of unequal sizes (3 + 1 rows of the tiny model's 4), give the
/// whole batch's mean loss and gradient, up to float rounding: each pass's loss is
/// weighed by its share of the rows and the gradients are summed.
#[test]
fn passes_give_the_whole_batchs_loss_and_gradient() {
    let whole = trainer(0);
    assert_eq!(whole.config.batch, 4);
    let (loss, grad) = loss_and_gradient(&whole);
    let norm = grad.iter().map(|g| g * g).sum::<f32>().sqrt();
    assert!(norm > 0.0);
    for rows in [1, 3, 4, 100] {
        let (l, g) = loss_and_gradient(&trainer(rows));
        assert!((l - loss).abs() <= 1e-5 * loss.abs(), "{rows} rows: loss {l} against {loss}");
        let diff = grad.iter().zip(&g).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt();
        assert!(diff <= 1e-5 * norm, "{rows} rows: gradient off by {diff} (norm {norm})");
    }
}

/// Steps in passes train like whole steps: after a few, the same loss readings and the same
/// validation loss, up to float rounding.
#[test]
fn steps_in_passes_train_like_whole_steps() {
    let (mut whole, mut parts) = (trainer(0), trainer(1));
    for step in 0..4 {
        let a = whole.step().unwrap().loss.unwrap();
        let b = parts.step().unwrap().loss.unwrap();
        assert!((a - b).abs() <= 1e-4 * a.abs(), "step {step}: loss {b} against {a}");
    }
    assert_eq!(whole.state(), parts.state());
    let (a, b) = (whole.evaluate(), parts.evaluate());
    assert!((a - b).abs() <= 1e-4 * a.abs(), "validation {b} against {a}");
}

/// A step's work runs on a thread of the compute pool, from any caller, and returns what
/// it computed; on a pool thread already (a pool of one's own, as `pace` installs) it
/// stays on that pool.
#[test]
fn compute_runs_on_a_pool_thread() {
    let cpu = Backend::Flex;
    let outside =
        std::thread::spawn(move || on_compute_pool(cpu, || (rayon::current_thread_index(), 7)));
    assert!(matches!(outside.join().unwrap(), (Some(_), 7)));
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let inside = pool.install(|| on_compute_pool(cpu, rayon::current_num_threads));
    assert_eq!(inside, 1, "stayed on the installed pool of one thread");
}

/// With Muon, exactly the blocks' six weight matrices per layer take Muon (by the module
/// paths the optimizer matches), and its record holds one moment for each of them where
/// AdamW's holds two: the group reached the matrices it names and nothing else.
#[test]
fn muon_steps_the_blocks_matrices_and_nothing_else() {
    /// Each float parameter's module path (as the optimizer's mapper spells it), rank and size.
    #[derive(Default)]
    struct Paths {
        at: Vec<String>,
        seen: Vec<(String, usize)>,
    }
    impl burn::module::ModuleVisitor for Paths {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.at.push(name.to_owned());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.at.pop();
        }
        fn visit_float<const D: usize>(&mut self, p: &burn::module::Param<Tensor<D>>) {
            self.seen.push((self.at.join("."), D * 1_000_000 + p.val().shape().num_elements()));
        }
    }
    let corpus = Corpus::embedded().unwrap();
    let run = |optimizer| {
        let config = TrainConfig { optimizer, ..TrainConfig::tiny(7) };
        let mut t = Trainer::new(config, Backend::default(), &corpus, Shard::WHOLE).unwrap();
        let first = t.step().unwrap().loss.unwrap();
        let mut last = first;
        for _ in 0..20 {
            last = t.step().unwrap().loss.unwrap();
        }
        assert!(last < first, "{optimizer:?}: loss {first} → {last}");
        (t.optim.into_bytes().unwrap().len(), t)
    };
    let (adamw, _) = run(InnerOptimizer::Adamw);
    let (muon, t) = run(InnerOptimizer::Muon);
    let mut paths = Paths::default();
    t.model.visit(&mut paths);
    let group = ParamGroup::from_regex(MUON_PARAMS).unwrap();
    let id = burn::module::ParamId::new();
    let matched: Vec<&(String, usize)> =
        paths.seen.iter().filter(|(p, _)| group.matches(&id, Some(p))).collect();
    let layers = t.config.model.n_layers;
    assert_eq!(matched.len(), 6 * layers, "{:?}", paths.seen);
    assert!(matched.iter().all(|(_, k)| k / 1_000_000 == 2), "{matched:?}");
    let values: usize = matched.iter().map(|(_, k)| k % 1_000_000).sum();
    // One f32 moment fewer per matrix value, give or take the records' framing.
    let saved = adamw as i64 - muon as i64;
    let want = 4 * values as i64;
    assert!((saved - want).abs() < want / 10, "saved {saved} bytes, want about {want}");
}

/// A Muon trainer's checkpoint parts restore to a trainer that takes the same next step.
#[test]
fn a_muon_trainer_restores_its_momentum() {
    let corpus = Corpus::embedded().unwrap();
    let config = TrainConfig { optimizer: InnerOptimizer::Muon, ..TrainConfig::tiny(7) };
    let mut t = Trainer::new(config.clone(), Backend::default(), &corpus, Shard::WHOLE).unwrap();
    for _ in 0..3 {
        t.step().unwrap();
    }
    let (model, optim) = t.snapshot().unwrap();
    let mut back = Trainer::restore(
        config,
        Backend::default(),
        &corpus,
        Shard::WHOLE,
        t.state(),
        model,
        optim,
    )
    .unwrap();
    let (a, b) = (t.step().unwrap().loss.unwrap(), back.step().unwrap().loss.unwrap());
    assert_eq!(a, b);
    let (a, b) = (t.step().unwrap().loss.unwrap(), back.step().unwrap().loss.unwrap());
    assert_eq!(a, b, "the second step after the restore, which the momentum steers");
}

/// The default run trains with Muon, the tiny test model and the larger presets with
/// AdamW, and a config that names no optimizer (every manifest written before the setting
/// existed) means AdamW, and one that chose AdamW is written without it.
#[test]
fn a_config_that_names_no_optimizer_means_adamw() {
    use super::preset::Preset;
    assert_eq!(TrainConfig::default().optimizer, InnerOptimizer::Muon);
    assert_eq!(Preset::Default.train_config(0).optimizer, InnerOptimizer::Muon);
    for p in [Preset::Tiny, Preset::Small, Preset::Base] {
        assert_eq!(p.train_config(0).optimizer, InnerOptimizer::Adamw, "{p:?}");
    }
    let mut json = serde_json::to_value(TrainConfig::default()).unwrap();
    assert_eq!(json["optimizer"], "muon");
    json.as_object_mut().unwrap().remove("optimizer");
    let old: TrainConfig = serde_json::from_value(json).unwrap();
    assert_eq!(old.optimizer, InnerOptimizer::Adamw);
    let written = serde_json::to_value(&old).unwrap();
    assert!(written.get("optimizer").is_none(), "{written}");
}
