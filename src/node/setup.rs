//! Opening a node: the trainer (resumed or fresh), the protocol state (saved anchors or
//! the run's initial parameters) and the protocol's id of a libp2p peer.

use super::error::NodeError;
use crate::backend::Backend;
use crate::fragment::FragmentPlan;
use crate::model::params::{read_fragment, tensor_specs, write_fragment};
use crate::proto::Millis;
use crate::proto::{PeerId, Protocol, Settings};
use crate::train::{TrainConfig, Trainer};

use super::NodeOptions;
use crate::rundir::anchors;

/// The run's initial parameters, fragment by fragment: the model initialised from the run
/// seed, identical on every peer. Drawn on the CPU whatever the peer trains on (a GPU
/// trainer starts from these same values, `train::init_model`).
pub fn initial_anchors(config: &TrainConfig, plan: &FragmentPlan) -> Vec<Vec<f32>> {
    let model = crate::train::init_model(config, &Backend::Flex.train_device());
    plan.fragments
        .iter()
        .map(|f| read_fragment(&model, f).expect("the plan was made from this model"))
        .collect()
}

/// The protocol's id of a libp2p peer: the first 8 bytes of blake3 of its id.
pub fn proto_peer(peer: &atoll_net::PeerId) -> PeerId {
    let h = blake3::hash(&peer.to_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.as_bytes()[..8]);
    PeerId(u64::from_le_bytes(b))
}

/// The trainer of the run dir's checkpoint, or a fresh one (`true`).
pub(super) fn open_trainer(opts: &NodeOptions) -> Result<(Trainer, bool), NodeError> {
    let path = crate::checkpoint::path_in(&opts.run_dir);
    if path.exists() {
        let ckpt = crate::checkpoint::load(&path)?;
        if ckpt.meta.config != opts.manifest.train {
            return Err(NodeError::OtherRun(opts.run_dir.clone()));
        }
        tracing::info!(step = ckpt.meta.state.step, "resuming from checkpoint");
        let mut trainer = ckpt.on(opts.backend).into_trainer(&opts.corpus)?;
        trainer.set_micro_batch(opts.micro_batch);
        return Ok((trainer, false));
    }
    let mut trainer =
        Trainer::new(opts.manifest.train.clone(), opts.backend, &opts.corpus, opts.shard)?;
    trainer.set_micro_batch(opts.micro_batch);
    Ok((trainer, true))
}

/// The first saved state whose round lies beyond the next round by the run's clock, as
/// `(fragment, its round, the current round)`: no honest merge can have produced it, and a
/// peer holding it would refuse every real state as older.
fn from_the_future(
    states: &[crate::proto::FragmentState],
    settings: &Settings,
    manifest: &crate::manifest::Manifest,
    clock: super::Clock,
) -> Option<(usize, u64, u64)> {
    let now = clock.unix_ms().saturating_sub(manifest.epoch_unix_ms);
    let schedule = crate::proto::Schedule::new(settings);
    states.iter().enumerate().find_map(|(p, s)| {
        let current = schedule.current_round(p, now);
        (s.round > current.saturating_add(1)).then_some((p, s.round, current))
    })
}

/// The protocol state: the saved anchors, or else the run's initial parameters — read from
/// `initial` when it is a fresh trainer (its weights are the seed's draw), drawn again
/// otherwise (a resumed trainer's weights have moved on).
pub(super) fn open_protocol(
    opts: &NodeOptions,
    settings: &Settings,
    plan: &FragmentPlan,
    initial: Option<&Trainer>,
) -> Result<(Protocol, bool), NodeError> {
    let seed = opts.manifest.train.seed ^ u64::from(opts.shard.index);
    let key_peer = atoll_net::PeerId::from(opts.net.keypair.public());
    let me = proto_peer(&key_peer);
    match anchors::load(&opts.run_dir, plan) {
        Ok(Some(states)) => match from_the_future(&states, settings, &opts.manifest, opts.clock) {
            None => {
                tracing::info!(round = states[0].round, "resuming protocol state");
                let mut proto = Protocol::restore(me, settings.clone(), plan, states, seed)?;
                restore_residuals(&mut proto, &opts.run_dir, plan);
                return Ok((proto, true));
            }
            Some((fragment, round, now_round)) => tracing::warn!(
                fragment,
                round,
                now_round,
                "saved anchors claim a round the run's clock has not reached (a forged or \
                 wedged state): ignoring them and catching up from the swarm"
            ),
        },
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(error = %e, "cannot read saved anchors; catching up from the swarm")
        }
    }
    let init = match initial {
        // A second draw of a 10M-parameter model costs about half a second of a join.
        Some(t) => plan
            .fragments
            .iter()
            .map(|f| read_fragment(t.model(), f).expect("the plan was made from this model"))
            .collect(),
        None => initial_anchors(&opts.manifest.train, plan),
    };
    Ok((Protocol::new(me, settings.clone(), plan, init, seed)?, false))
}

/// Continues the error-feedback residuals saved beside the anchors. One that is missing
/// starts at zero; one that cannot be read is reported and starts at zero (what it held
/// is delayed signal, not state the swarm depends on).
fn restore_residuals(proto: &mut Protocol, run_dir: &std::path::Path, plan: &FragmentPlan) {
    let mut restored = Vec::new();
    for spec in &plan.fragments {
        match anchors::load_residual(run_dir, spec) {
            Ok(Some(r)) => {
                let norm = crate::delta::l2_norm(&r);
                if proto.restore_residual(spec.id, r) {
                    restored.push(norm);
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "cannot read a saved residual; it starts at zero"),
        }
    }
    if !restored.is_empty() {
        let norms: Vec<String> = restored.iter().map(|n| format!("{n:e}")).collect();
        tracing::info!(fragments = restored.len(), norms = %norms.join(","), "continuing the error-feedback residuals");
    }
}

/// A node's trainer and protocol state, opened from its run dir and manifest.
pub(super) struct Opened {
    pub trainer: crate::train::Trainer,
    pub fresh: bool,
    pub plan: FragmentPlan,
    pub proto: Protocol,
    pub period: Millis,
    pub started_unix_ms: u64,
}

pub(super) fn open(opts: &NodeOptions) -> Result<Opened, NodeError> {
    let settings = opts.manifest.validate()?;
    opts.manifest.check_corpus(&opts.corpus)?;
    std::fs::create_dir_all(&opts.run_dir)
        .map_err(|source| NodeError::RunDir { path: opts.run_dir.clone(), source })?;
    let started_unix_ms = opts.clock.unix_ms();
    let (mut trainer, fresh) = open_trainer(opts)?;
    let plan = FragmentPlan::new(&tensor_specs(trainer.model()), settings.raw().fragments)?;
    let (proto, saved) = open_protocol(opts, &settings, &plan, fresh.then_some(&trainer))?;
    if fresh && saved {
        // A fresh peer starts from the current anchors, never from a draw of its own (the
        // run's initial parameters are the fresh trainer's own weights already).
        for spec in &plan.fragments {
            write_fragment(trainer.model_mut(), spec, &proto.state(spec.id).anchor)?;
        }
    }
    Ok(Opened { trainer, fresh, plan, proto, period: settings.period_ms(), started_unix_ms })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Corpus, Shard};

    /// A fresh node reads the run's initial anchors off its own trainer instead of drawing
    /// the model a second time: that is only right while both draws are the same, on every
    /// shard (and while they depend on the seed).
    #[test]
    fn a_fresh_trainer_holds_the_runs_initial_anchors() {
        let corpus = Corpus::embedded().unwrap();
        let fresh = |seed, index| {
            let shard = Shard { index, count: 3 };
            Trainer::new(TrainConfig::tiny(seed), Backend::default(), &corpus, shard).unwrap()
        };
        let plan = FragmentPlan::new(&tensor_specs(fresh(7, 0).model()), 4).unwrap();
        let own = |t: &Trainer| -> Vec<Vec<f32>> {
            plan.fragments.iter().map(|f| read_fragment(t.model(), f).unwrap()).collect()
        };
        let init = initial_anchors(&TrainConfig::tiny(7), &plan);
        for index in 0..3 {
            assert!(own(&fresh(7, index)) == init, "shard {index} starts elsewhere");
        }
        assert!(own(&fresh(8, 0)) != init, "another seed must draw other weights");
    }
}
