//! The fragment interface the protocol uses: read a fragment as a flat f32 buffer, write one
//! back, bit-exact, touching nothing else.

use atoll::backend::Backend;
use atoll::data::{Corpus, Shard};
use atoll::fragment::FragmentPlan;
use atoll::model::params::{
    read_fragment, tensor_specs, write_fragment, ParamsError, EMBEDDING_TENSOR,
};
use atoll::train::{TrainConfig, Trainer};

fn trainer() -> Trainer {
    let corpus = Corpus::embedded().unwrap();
    Trainer::new(TrainConfig::tiny(1), Backend::Flex, &corpus, Shard::WHOLE).unwrap()
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn every_fragment_round_trips_bit_exact() {
    let mut t = trainer();
    let specs = tensor_specs(t.model());
    assert!(specs.iter().any(|s| s.name == EMBEDDING_TENSOR && s.is_embedding));
    let plan = FragmentPlan::new(&specs, 4).unwrap();
    assert_eq!(plan.numel(), burn::module::Module::num_params(t.model()));
    for frag in &plan.fragments {
        let original = read_fragment(t.model(), frag).unwrap();
        assert_eq!(original.len(), frag.numel());
        let others: Vec<Vec<f32>> = plan
            .fragments
            .iter()
            .filter(|f| f.id != frag.id)
            .map(|f| read_fragment(t.model(), f).unwrap())
            .collect();
        // Values chosen to catch any rounding: tiny, huge, negative zero, subnormal.
        let written: Vec<f32> = (0..original.len())
            .map(|i| match i % 4 {
                0 => -0.0,
                1 => f32::MIN_POSITIVE / 3.0,
                2 => 1.0e30 + i as f32,
                _ => original[i] * 1.5 - 0.25,
            })
            .collect();
        write_fragment(t.model_mut(), frag, &written).unwrap();
        assert_eq!(
            bits(&read_fragment(t.model(), frag).unwrap()),
            bits(&written),
            "fragment {}",
            frag.id
        );
        let others_after: Vec<Vec<f32>> = plan
            .fragments
            .iter()
            .filter(|f| f.id != frag.id)
            .map(|f| read_fragment(t.model(), f).unwrap())
            .collect();
        assert_eq!(others, others_after, "writing fragment {} changed another fragment", frag.id);
        write_fragment(t.model_mut(), frag, &original).unwrap();
        assert_eq!(bits(&read_fragment(t.model(), frag).unwrap()), bits(&original));
    }
}

#[test]
fn a_wrong_buffer_is_refused_and_leaves_the_model_alone() {
    let mut t = trainer();
    let plan = FragmentPlan::new(&tensor_specs(t.model()), 3).unwrap();
    let frag = &plan.fragments[1];
    let before = read_fragment(t.model(), frag).unwrap();
    let err = write_fragment(t.model_mut(), frag, &before[1..]).unwrap_err();
    assert!(matches!(err, ParamsError::WrongLength { .. }), "{err}");
    let mut alien = frag.clone();
    alien.tensors[0].name = "no.such.tensor".into();
    let err = write_fragment(t.model_mut(), &alien, &before).unwrap_err();
    assert!(matches!(err, ParamsError::UnknownTensor(_)), "{err}");
    assert_eq!(read_fragment(t.model(), frag).unwrap(), before);
}

#[test]
fn training_continues_through_a_written_fragment() {
    let mut t = trainer();
    let plan = FragmentPlan::new(&tensor_specs(t.model()), 2).unwrap();
    for _ in 0..3 {
        t.step().unwrap();
    }
    for frag in &plan.fragments {
        let values = read_fragment(t.model(), frag).unwrap();
        write_fragment(t.model_mut(), frag, &values).unwrap();
    }
    let before: Vec<Vec<f32>> =
        plan.fragments.iter().map(|f| read_fragment(t.model(), f).unwrap()).collect();
    let stats = t.step().unwrap();
    assert!(stats.loss.unwrap().is_finite());
    for (frag, old) in plan.fragments.iter().zip(&before) {
        let new = read_fragment(t.model(), frag).unwrap();
        assert_ne!(&new, old, "fragment {} got no update after being written", frag.id);
    }
}
