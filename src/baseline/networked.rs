//! The synchronous baselines as real peers over atoll-net: data-parallel (gradients
//! averaged every inner step) and synchronous DiLoCo (H inner steps, then the outer deltas
//! averaged at a barrier and one outer Nesterov step), on the same manifest, shards, seed
//! and initial parameters as a swarm peer. They write the same `status.json` and
//! `metrics.jsonl`, so `atoll demo --method dp|diloco` runs and summarises them like a
//! swarm, and their bytes are counted by atoll-net on the wire like atoll's.
//!
//! Peers meet under the manifest's name plus `-dp` or `-diloco`, so a baseline never
//! mixes with a swarm of the same run.
//!
//! Every mean the group takes is written to `merges.jsonl` like a swarm merge (one
//! contribution per member, its buffer's hash and the tokens it trained for it), so
//! `atoll chaos` measures the baselines' goodput and uptime as it measures the swarm's.
//! With a time limit (`duration`), every reduced buffer carries one more value, "my clock
//! is past the limit": the group stops after the first mean in which any member said so,
//! so every member stops after the same step.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use atoll_net::{NetConfig, Node};

use super::BaselineError;
use crate::backend::Backend;
use crate::collective::{CollectiveError, Group};
use crate::data::{Corpus, Shard};
use crate::fragment::FragmentPlan;
use crate::manifest::Manifest;
use crate::metrics::{append_jsonl, bits_per_byte, MetricsLog, MetricsRecord};
use crate::model::params::{read_fragment, tensor_specs, write_fragment};
use crate::node::{initial_anchors, Network, NodeReport, Slowdown};
use crate::proto::merge::outer_step;
use crate::proto::FragmentState;
use crate::rundir::anchors;
use crate::rundir::ledger::{self, ContributionRecord, MergeRecord};
use crate::rundir::status::{self, TrainingStatus};
use crate::train::{LossMean, Trainer};

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
    /// Stop (all members together, see the module docs) once this much time has passed.
    pub duration: Option<Duration>,
    /// Drop members that miss a barrier by `timeout` instead of failing.
    pub elastic: bool,
    pub timeout: Duration,
    /// Emulated hardware (`--slowdown`, `--min-step-ms`): applied to each inner step's
    /// compute, before its gradients are averaged (data-parallel).
    pub slowdown: Slowdown,
}

/// Trains one peer of a synchronous baseline to `steps`.
pub async fn run(mut opts: SyncPeer) -> Result<NodeReport, BaselineError> {
    let settings = opts.manifest.validate()?;
    opts.manifest.check_corpus(&opts.corpus)?;
    std::fs::create_dir_all(&opts.run_dir)?;
    let train = opts.manifest.train.clone();
    let mut trainer = Trainer::new(train.clone(), opts.backend, &opts.corpus, opts.shard)?;
    let plan = FragmentPlan::new(&tensor_specs(trainer.model()), settings.raw().fragments)?;
    for (spec, values) in plan.fragments.iter().zip(initial_anchors(&train, &plan)) {
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
    // An elastic group's barrier is short (a dead member stalls everyone that long), and
    // starting the processes takes longer: it gets a minute to form.
    let form = if opts.elastic { opts.timeout.max(Duration::from_secs(60)) } else { opts.timeout };
    let mut group =
        Group::form(client.clone(), events, run, opts.peers, opts.elastic, form).await?;
    group.set_timeout(opts.timeout);
    tracing::info!(members = group.members().len(), "group formed; training");
    let handle = tokio::runtime::Handle::current();
    let raw = settings.raw().clone();
    let method = opts.method;
    let (run_dir, steps, duration) = (opts.run_dir.clone(), opts.steps, opts.duration);
    let proto_id = client.peer_id().to_string();
    let work = tokio::task::spawn_blocking(move || {
        let mut job = Job {
            trainer,
            plan,
            group,
            handle,
            client,
            ledger: run_dir.join(ledger::FILE_NAME),
            run_dir,
            status: TrainingStatus { proto_id, ..TrainingStatus::default() },
            reduced_tokens: 0,
            slowdown: opts.slowdown,
        };
        let until = Until { steps, deadline: duration.map(|d| Instant::now() + d) };
        job.train(method, until, raw.h.max(1), raw.outer_lr, raw.momentum)
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
    ledger: PathBuf,
    status: TrainingStatus,
    /// Tokens this peer had trained at its latest mean.
    reduced_tokens: u64,
    slowdown: Slowdown,
}

/// When training stops: at `steps`, or at the first mean after `deadline`.
struct Until {
    steps: u64,
    deadline: Option<Instant>,
}

impl Until {
    /// The value this peer adds to a reduced buffer: positive once its clock is past.
    fn flag(&self) -> f32 {
        f32::from(u8::from(self.deadline.is_some_and(|d| Instant::now() >= d)))
    }
}

/// Takes the stop flag off a reduced buffer: did any member raise it?
fn agreed_stop(mean: &mut Vec<f32>) -> bool {
    mean.pop().is_some_and(|f| f > 0.0)
}

impl<N: Network> Job<N> {
    fn train(
        &mut self,
        method: Method,
        until: Until,
        h: u64,
        outer_lr: f32,
        momentum: f32,
    ) -> Result<NodeReport, BaselineError> {
        let started = Instant::now();
        let mut anchor = self.params()?;
        self.status.param_count = anchor.len();
        let mut buf = vec![0f32; anchor.len()];
        let log = MetricsLog::new(&self.run_dir);
        let every = self.trainer.config().val_every.max(1);
        let (mut last_status, mut window) = (Instant::now(), LossMean::default());
        let mut outer = 0u64;
        let steps = until.steps;
        self.status.target_step = until.deadline.is_none().then_some(steps);
        let (mut stop, mut evicted) = (false, false);
        while !stop && self.trainer.state().step < steps {
            let step = self.trainer.state().step;
            let (computing, slowdown) = (Instant::now(), self.slowdown);
            let s = match method {
                Method::DataParallel => {
                    let (group, handle) = (&mut self.group, &self.handle);
                    let flag = until.flag();
                    let done = self.trainer.step_reduced(|g| {
                        slowdown.idle_after(computing);
                        g.push(flag);
                        *g = handle.block_on(group.mean(step, g))?;
                        stop = agreed_stop(g);
                        Ok::<_, BaselineError>(())
                    });
                    match done {
                        Err(BaselineError::Collective(CollectiveError::Evicted { .. })) => {
                            evicted = true;
                            break;
                        }
                        other => other?,
                    }
                }
                Method::Diloco => {
                    let s = self.trainer.step()?;
                    slowdown.idle_after(computing);
                    s
                }
            };
            let done = self.trainer.state().step;
            if method == Method::DataParallel {
                self.record(step);
            }
            if method == Method::Diloco && (done % h == 0 || done == steps) {
                let theta = self.params()?;
                let mut delta: Vec<f32> = anchor.iter().zip(&theta).map(|(a, t)| a - t).collect();
                delta.push(until.flag());
                let mut mean = match self.handle.block_on(self.group.mean(outer, &delta)) {
                    Err(CollectiveError::Evicted { .. }) => {
                        evicted = true;
                        break;
                    }
                    other => other?,
                };
                stop = agreed_stop(&mut mean);
                outer_step(&mut anchor, &mut buf, &mean, outer_lr, momentum);
                self.set_params(&anchor)?;
                self.record(outer);
                outer += 1;
                self.status.merges = outer;
            }
            let validate = done % every == 0 || done == steps || stop;
            let rest = if validate { self.trainer.read_loss() } else { (None, 0) };
            for reading in [(s.loss, s.losses), rest] {
                // A diverged peer's loss is reported, not acted on, by a baseline.
                let _ = window.add(reading);
                self.status.loss = reading.0.or(self.status.loss);
            }
            self.status.step = done;
            self.status.tokens = self.trainer.state().tokens;
            if validate {
                let val_loss = self.trainer.evaluate();
                let secs = started.elapsed().as_secs_f64();
                let record = MetricsRecord {
                    step: done,
                    tokens: self.status.tokens,
                    train_loss: window.mean(),
                    val_loss,
                    val_bpb: bits_per_byte(val_loss),
                    tokens_per_s: self.status.tokens as f64 / secs.max(1e-9),
                    wall_s: secs,
                };
                window = LossMean::default();
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
        self.status.trained = true;
        if evicted {
            // Its parameters are no longer the group's: nothing final to report.
            tracing::warn!(step = self.status.step, "left behind by the group; stopping");
            self.write_status(false);
            return Err(BaselineError::Collective(CollectiveError::Evicted {
                step: self.status.step,
            }));
        }
        let final_loss = self.trainer.evaluate();
        let params = self.params()?;
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
        self.handle.block_on(self.group.finish());
        Ok(NodeReport {
            step: self.status.step,
            tokens: self.status.tokens,
            final_val_loss: final_loss,
            final_val_bpb: bits_per_byte(final_loss),
            anchor_hashes: self.status.anchor_hashes.clone(),
        })
    }

    /// Appends the group's latest mean to `merges.jsonl`: every member trained as many
    /// tokens for it as this one (the same steps, the same batch).
    fn record(&mut self, round: u64) {
        let tokens = self.trainer.state().tokens;
        let each = tokens.saturating_sub(std::mem::replace(&mut self.reduced_tokens, tokens));
        let contributions = self
            .group
            .averaged()
            .iter()
            .map(|(peer, hash)| ContributionRecord {
                peer: peer.to_string(),
                hash: hash.to_string(),
                tokens: each,
                agreement: 1.0,
            })
            .collect();
        let record = MergeRecord { unix_ms: status::unix_ms(), fragment: 0, round, contributions };
        if let Err(e) = append_jsonl(&self.ledger, &record) {
            tracing::warn!(error = %e, "cannot append to merges.jsonl");
        }
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
