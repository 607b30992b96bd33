//! The synchronous baselines as real peers over atoll-net: data-parallel (gradients
//! averaged every inner step) and synchronous DiLoCo (H inner steps, then the outer deltas
//! averaged at a barrier and one outer Nesterov step), on the same manifest, shards, seed
//! and initial parameters as a swarm peer. They write the same `status.json` and
//! `metrics.jsonl`, so `atoll demo --method dp|diloco` runs and summarises them like a
//! swarm, and their bytes are counted by atoll-net on the wire like atoll's.
//!
//! Peers meet under the manifest's name plus `-dp` or `-diloco`, so a baseline never
//! mixes with a swarm of the same run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use atoll_net::{NetConfig, Node};

use super::BaselineError;
use crate::backend::Backend;
use crate::collective::Group;
use crate::data::{Corpus, Shard};
use crate::fragment::FragmentPlan;
use crate::manifest::Manifest;
use crate::metrics::{bits_per_byte, MetricsLog, MetricsRecord};
use crate::model::params::{read_fragment, tensor_specs, write_fragment};
use crate::node::status::{self, TrainingStatus};
use crate::node::{anchors, initial_anchors, Network, NodeReport};
use crate::proto::merge::outer_step;
use crate::proto::FragmentState;
use crate::train::Trainer;

/// How often `status.json` is rewritten.
const STATUS_EVERY: Duration = Duration::from_secs(1);

/// Which synchronous method a peer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Gradients averaged over the group every inner step.
    DataParallel,
    /// `h` inner steps, then the outer deltas averaged and one outer Nesterov step with the
    /// manifest's outer learning rate and momentum (plain mean, full precision).
    Diloco,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::DataParallel => "dp",
            Method::Diloco => "diloco",
        }
    }
}

/// Everything a synchronous baseline peer needs.
pub struct SyncPeer {
    pub manifest: Manifest,
    pub corpus: Corpus,
    pub run_dir: PathBuf,
    pub shard: Shard,
    pub backend: Backend,
    /// Network settings; the run name is replaced (see the module docs).
    pub net: NetConfig,
    pub method: Method,
    /// Peers in the group (the run waits for all of them before the first step).
    pub peers: usize,
    pub steps: u64,
    /// Drop members that miss a barrier by `timeout` instead of failing.
    pub elastic: bool,
    pub timeout: Duration,
}

/// Trains one peer of a synchronous baseline to `steps`.
pub async fn run(mut opts: SyncPeer) -> Result<NodeReport, BaselineError> {
    let settings = opts.manifest.validate()?;
    opts.manifest.check_corpus(&opts.corpus)?;
    std::fs::create_dir_all(&opts.run_dir)?;
    let train = opts.manifest.train.clone();
    let mut trainer = Trainer::new(train.clone(), opts.backend, &opts.corpus, opts.shard)?;
    let plan = FragmentPlan::new(&tensor_specs(trainer.model()), settings.raw().fragments)?;
    for (spec, values) in plan.fragments.iter().zip(initial_anchors(&train, opts.backend, &plan)) {
        write_fragment(trainer.model_mut(), spec, &values)?;
    }
    opts.net.run_name = format!("{}-{}", opts.manifest.name, opts.method.name());
    let mut node = Node::start(opts.net.clone()).await?;
    let client = node.client.clone();
    // Listen addresses go into status.json at once: the others bootstrap from them.
    let path = opts.run_dir.join(status::FILE_NAME);
    status::write(&path, true, client.stats().await?, Some(TrainingStatus::default()))?;
    tracing::info!(method = opts.method.name(), peers = opts.peers, "waiting for the group");
    let events = std::mem::replace(&mut node.events, tokio::sync::mpsc::channel(1).1);
    let run = opts.manifest.run_id().0;
    let group =
        Group::form(client.clone(), events, run, opts.peers, opts.elastic, opts.timeout).await?;
    tracing::info!(members = group.members().len(), "group formed; training");
    let handle = tokio::runtime::Handle::current();
    let raw = settings.raw().clone();
    let method = opts.method;
    let (run_dir, steps) = (opts.run_dir.clone(), opts.steps);
    let work = tokio::task::spawn_blocking(move || {
        let mut job = Job {
            trainer,
            plan,
            group,
            handle,
            client,
            run_dir,
            status: TrainingStatus::default(),
        };
        job.train(method, steps, raw.h.max(1), raw.outer_lr, raw.momentum)
    });
    let result = work.await.map_err(|e| BaselineError::Stopped(e.to_string()))?;
    node.handle.shutdown().await?;
    result
}

struct Job<N> {
    trainer: Trainer,
    plan: FragmentPlan,
    group: Group<N>,
    handle: tokio::runtime::Handle,
    client: N,
    run_dir: PathBuf,
    status: TrainingStatus,
}

impl<N: Network> Job<N> {
    fn train(
        &mut self,
        method: Method,
        steps: u64,
        h: u64,
        outer_lr: f32,
        momentum: f32,
    ) -> Result<NodeReport, BaselineError> {
        let started = Instant::now();
        let mut anchor = self.params()?;
        let mut buf = vec![0f32; anchor.len()];
        let log = MetricsLog::new(&self.run_dir);
        let every = self.trainer.config().val_every.max(1);
        let (mut last_status, mut loss_sum, mut losses) = (Instant::now(), 0.0, 0u64);
        let mut outer = 0u64;
        self.status.target_step = Some(steps);
        while self.trainer.state().step < steps {
            let step = self.trainer.state().step;
            let s = match method {
                Method::DataParallel => {
                    let (group, handle) = (&mut self.group, &self.handle);
                    self.trainer.step_reduced(|g| {
                        *g = handle.block_on(group.mean(step, g))?;
                        Ok::<_, BaselineError>(())
                    })?
                }
                Method::Diloco => self.trainer.step(),
            };
            let done = self.trainer.state().step;
            if method == Method::Diloco && (done % h == 0 || done == steps) {
                let theta = self.params()?;
                let delta: Vec<f32> = anchor.iter().zip(&theta).map(|(a, t)| a - t).collect();
                let mean = self.handle.block_on(self.group.mean(outer, &delta))?;
                outer_step(&mut anchor, &mut buf, &mean, outer_lr, momentum);
                self.set_params(&anchor)?;
                outer += 1;
                self.status.merges = outer;
            }
            loss_sum += f64::from(s.loss);
            losses += 1;
            self.status.step = done;
            self.status.tokens = self.trainer.state().tokens;
            self.status.loss = Some(s.loss);
            if done % every == 0 || done == steps {
                let val_loss = self.trainer.evaluate();
                let secs = started.elapsed().as_secs_f64();
                let record = MetricsRecord {
                    step: done,
                    tokens: self.status.tokens,
                    train_loss: loss_sum / losses.max(1) as f64,
                    val_loss,
                    val_bpb: bits_per_byte(val_loss),
                    tokens_per_s: self.status.tokens as f64 / secs.max(1e-9),
                    wall_s: secs,
                };
                (loss_sum, losses) = (0.0, 0);
                self.status.val_bpb = Some(record.val_bpb);
                if let Err(e) = log.append(&record) {
                    tracing::warn!(error = %e, "cannot append to metrics.jsonl");
                }
                tracing::info!(
                    step = done,
                    val_bpb = format!("{:.3}", record.val_bpb),
                    "validation"
                );
            }
            if last_status.elapsed() >= STATUS_EVERY {
                last_status = Instant::now();
                self.write_status(true);
            }
        }
        let final_loss = self.trainer.evaluate();
        let params = self.params()?;
        self.status.trained = true;
        self.status.final_val_loss = Some(final_loss);
        self.status.final_val_bpb = Some(bits_per_byte(final_loss));
        // The final parameters, as fragment states: `atoll demo` compares them like anchors.
        let mut at = 0;
        let mut hashes = Vec::new();
        for spec in &self.plan.fragments {
            let values = params[at..at + spec.numel()].to_vec();
            at += spec.numel();
            let mut state = FragmentState::initial(spec.id as u32, values);
            state.round = outer;
            hashes.push(state.hash().to_string());
            anchors::save(&self.run_dir, &state)?;
        }
        self.status.anchor_hashes = hashes;
        self.write_status(false);
        Ok(NodeReport {
            step: self.status.step,
            tokens: self.status.tokens,
            final_val_loss: final_loss,
            final_val_bpb: bits_per_byte(final_loss),
            anchor_hashes: self.status.anchor_hashes.clone(),
        })
    }

    /// Every parameter, fragment after fragment.
    fn params(&self) -> Result<Vec<f32>, BaselineError> {
        let mut out = Vec::with_capacity(self.plan.numel());
        for spec in &self.plan.fragments {
            out.extend(read_fragment(self.trainer.model(), spec)?);
        }
        Ok(out)
    }

    fn set_params(&mut self, values: &[f32]) -> Result<(), BaselineError> {
        let mut at = 0;
        for spec in &self.plan.fragments {
            write_fragment(self.trainer.model_mut(), spec, &values[at..at + spec.numel()])?;
            at += spec.numel();
        }
        Ok(())
    }

    fn write_status(&self, running: bool) {
        let Ok(stats) = self.handle.block_on(self.client.stats()) else { return };
        let path = self.run_dir.join(status::FILE_NAME);
        if let Err(e) = status::write(&path, running, stats, Some(self.status.clone())) {
            tracing::warn!(error = %e, "cannot write status.json");
        }
    }
}
