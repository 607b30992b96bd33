//! A tour of the interface the protocol uses: build a model, cut it into fragments, train a
//! few steps, and read one fragment's drift from where it started (an outer delta).
//!
//! `cargo run --release --example fragments`

use atoll::backend::Backend;
use atoll::data::{Corpus, Shard};
use atoll::fragment::FragmentPlan;
use atoll::model::params::{read_fragment, tensor_specs, write_fragment};
use atoll::train::{TrainConfig, Trainer};

fn main() -> anyhow::Result<()> {
    let corpus = Corpus::embedded()?;
    let mut trainer =
        Trainer::new(TrainConfig::tiny(0), Backend::default(), &corpus, Shard::WHOLE)?;
    let plan = FragmentPlan::new(&tensor_specs(trainer.model()), 4)?;
    for frag in &plan.fragments {
        let names: Vec<&str> = frag.tensors.iter().map(|t| t.name.as_str()).collect();
        println!("fragment {}: {} values in {:?}", frag.id, frag.numel(), names);
    }
    let anchor = read_fragment(trainer.model(), &plan.fragments[1])?;
    for _ in 0..20 {
        trainer.step()?;
    }
    let local = read_fragment(trainer.model(), &plan.fragments[1])?;
    let delta: Vec<f32> = anchor.iter().zip(&local).map(|(a, l)| a - l).collect();
    let norm = delta.iter().map(|d| d * d).sum::<f32>().sqrt();
    println!("after 20 steps, fragment 1 drifted by |anchor - local| = {norm:.4}");
    // Taking the anchor back is one write between two inner steps.
    write_fragment(trainer.model_mut(), &plan.fragments[1], &anchor)?;
    Ok(())
}
