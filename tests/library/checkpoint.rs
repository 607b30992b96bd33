//! Checkpoints: an exact resume, every kind of damaged file detected and refused, and
//! atomic writes that survive a leftover temporary file and fail without damage.

use atoll::backend::Backend;
use atoll::checkpoint::{self, CheckpointError};
use atoll::data::{Corpus, Shard};
use atoll::fragment::FragmentPlan;
use atoll::model::params::{read_fragment, tensor_specs};
use atoll::train::{TrainConfig, Trainer};

fn all_params(t: &Trainer) -> Vec<u32> {
    let plan = FragmentPlan::new(&tensor_specs(t.model()), 1).unwrap();
    read_fragment(t.model(), &plan.fragments[0]).unwrap().iter().map(|v| v.to_bits()).collect()
}

fn saved_run(dir: &std::path::Path) -> (Corpus, Trainer) {
    let corpus = Corpus::embedded().unwrap();
    let shard = Shard { index: 1, count: 2 };
    let mut t = Trainer::new(TrainConfig::tiny(5), Backend::Flex, &corpus, shard).unwrap();
    for _ in 0..3 {
        t.step().unwrap();
    }
    checkpoint::save(&t, shard, &corpus, dir).unwrap();
    (corpus, t)
}

#[test]
fn resume_continues_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (corpus, mut original) = saved_run(dir.path());
    let ckpt = checkpoint::load(&checkpoint::path_in(dir.path())).unwrap();
    assert_eq!(ckpt.meta.state.step, 3);
    let mut resumed = ckpt.into_trainer(&corpus).unwrap();
    assert_eq!(resumed.state(), original.state());
    assert_eq!(all_params(&resumed), all_params(&original));
    // Same batch, same optimizer moments: the next step is identical.
    let (a, b) = (original.step().unwrap(), resumed.step().unwrap());
    assert_eq!(a.loss.unwrap().to_bits(), b.loss.unwrap().to_bits());
    assert_eq!(all_params(&resumed), all_params(&original));
}

#[test]
fn a_checkpoint_resumes_on_another_backend_with_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    let (corpus, original) = saved_run(dir.path());
    let ckpt = checkpoint::load(&checkpoint::path_in(dir.path())).unwrap();
    assert_eq!(ckpt.meta.backend, Backend::Flex);
    for backend in Backend::usable() {
        let ckpt = checkpoint::load(&checkpoint::path_in(dir.path())).unwrap();
        let resumed = ckpt.on(backend).into_trainer(&corpus).unwrap();
        assert_eq!(resumed.backend(), backend);
        assert_eq!(resumed.state(), original.state());
        assert_eq!(all_params(&resumed), all_params(&original), "{backend}");
    }
    // A backend this build lacks (a checkpoint from a GPU build) reads as the default.
    let meta = serde_json::to_string(&ckpt.meta).unwrap().replace("\"flex\"", "\"tpu\"");
    let meta: checkpoint::CheckpointMeta = serde_json::from_str(&meta).unwrap();
    assert_eq!(meta.backend, Backend::default());
}

fn expect_corrupt(path: &std::path::Path) {
    match checkpoint::load(path) {
        Err(CheckpointError::Corrupt { .. }) => {}
        other => panic!("expected a corrupt-checkpoint error, got {other:?}"),
    }
}

#[test]
fn truncated_flipped_and_foreign_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    saved_run(dir.path());
    let path = checkpoint::path_in(dir.path());
    let good = std::fs::read(&path).unwrap();

    for cut in [1, 31, 33, good.len() / 2, good.len() - 40] {
        std::fs::write(&path, &good[..good.len() - cut]).unwrap();
        expect_corrupt(&path);
    }
    for at in [12, 40, good.len() / 3, good.len() - 1] {
        let mut bad = good.clone();
        bad[at] ^= 0x10;
        std::fs::write(&path, &bad).unwrap();
        expect_corrupt(&path);
    }
    std::fs::write(&path, b"").unwrap();
    expect_corrupt(&path);
    std::fs::write(&path, b"hello, this is not a checkpoint at all, just some text").unwrap();
    expect_corrupt(&path);
    std::fs::write(&path, &good).unwrap();
    assert!(checkpoint::load(&path).is_ok());
}

#[test]
fn a_checkpoint_of_other_data_or_none_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    saved_run(dir.path());
    let other = Corpus::from_text("other", "a different text. ".repeat(2000).into_bytes()).unwrap();
    let err = checkpoint::load(&checkpoint::path_in(dir.path()))
        .unwrap()
        .into_trainer(&other)
        .unwrap_err();
    assert!(matches!(err, CheckpointError::OtherData { .. }), "{err}");
    let empty = tempfile::tempdir().unwrap();
    let err = checkpoint::load(&checkpoint::path_in(empty.path())).unwrap_err();
    assert!(matches!(err, CheckpointError::Missing(_)), "{err}");
}

#[test]
fn a_leftover_temporary_file_is_never_loaded_and_does_not_break_the_next_save() {
    let dir = tempfile::tempdir().unwrap();
    let (corpus, mut t) = saved_run(dir.path());
    let path = checkpoint::path_in(dir.path());
    let temp = checkpoint::temp_path(&path);
    assert_ne!(temp, path);
    assert_eq!(temp.parent(), path.parent(), "the rename must stay on one file system");
    // What a write killed halfway leaves behind.
    let good = std::fs::read(&path).unwrap();
    std::fs::write(&temp, &good[..good.len() / 2]).unwrap();
    assert_eq!(checkpoint::load(&path).unwrap().meta.state.step, 3);

    t.step().unwrap();
    checkpoint::save(&t, t.dataset().shard(), &corpus, dir.path()).unwrap();
    assert!(!temp.exists(), "the leftover was not replaced");
    assert_eq!(checkpoint::load(&path).unwrap().meta.state.step, 4);
}

#[test]
fn a_failed_write_keeps_the_old_file_and_holds_no_space() {
    let dir = tempfile::tempdir().unwrap();
    let (corpus, mut t) = saved_run(dir.path());
    let path = checkpoint::path_in(dir.path());
    let temp = checkpoint::temp_path(&path);
    t.step().unwrap();
    // The temporary file cannot be created: the error names the checkpoint, the old one
    // is untouched.
    std::fs::create_dir_all(temp.join("in-the-way")).unwrap();
    let err = checkpoint::save(&t, t.dataset().shard(), &corpus, dir.path()).unwrap_err();
    assert!(matches!(err, CheckpointError::Io { .. }), "{err}");
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");
    assert_eq!(checkpoint::load(&path).unwrap().meta.state.step, 3);
    std::fs::remove_dir_all(&temp).unwrap();

    // The rename fails after the data was written: the temporary file is removed.
    let target = dir.path().join("blocked");
    std::fs::create_dir_all(target.join("in-the-way")).unwrap();
    assert!(checkpoint::write_atomic(&target, b"some bytes").is_err());
    assert!(!checkpoint::temp_path(&target).exists(), "a failed write left its temporary file");

    checkpoint::save(&t, t.dataset().shard(), &corpus, dir.path()).unwrap();
    assert_eq!(checkpoint::load(&path).unwrap().meta.state.step, 4);
}
