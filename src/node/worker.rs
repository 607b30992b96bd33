//! The trainer of a node: inner steps, validation, checkpoints, and, between two steps,
//! the protocol's snapshot requests and merged anchors. It never waits on the network:
//! commands are drained without blocking before every step.

use std::path::PathBuf;
use std::time::Instant;

use super::clock::Clock;
use super::slowdown::Slowdown;

use tokio::sync::mpsc;

use crate::checkpoint;
use crate::data::Corpus;
use crate::delta::ContentHash;
use crate::fragment::{FragmentPlan, FragmentSpec};
use crate::metrics::{bits_per_byte, MetricsLog, MetricsRecord};
use crate::model::params::{read_fragment, write_fragment};
use crate::proto::{ApplyAnchor, Losses};
use crate::train::{LossMean, Trainer};

/// Commands to the training thread.
#[derive(Debug)]
pub enum ToWorker {
    /// Answer with [`FromWorker::Snapshot`] of this fragment.
    Snapshot { fragment: usize, round: u64 },
    /// Take a merged anchor between two steps.
    Apply(ApplyAnchor),
    /// Answer with [`FromWorker::Weighed`]: the validation loss with the fragment set to
    /// `anchor` (a state offered for adoption), and set to `own` (this peer's anchor). The
    /// model's parameters are put back as they were.
    Weigh { fragment: usize, hash: ContentHash, anchor: Vec<f32>, own: Vec<f32>, margin: f64 },
    /// Take the first inner step (a peer joining a running swarm is held until it holds
    /// the swarm's anchors).
    Start,
    /// Stop taking inner steps as if the step target were reached (checkpoint, report
    /// [`FromWorker::Trained`]) and keep answering commands.
    StopTraining,
    /// Stop training (the target was reached or the node is leaving): apply what came
    /// before, evaluate, checkpoint and report [`FromWorker::Finished`].
    Finish,
}

/// Reports of the training thread.
#[derive(Debug)]
pub enum FromWorker {
    Snapshot {
        fragment: usize,
        round: u64,
        params: Vec<f32>,
        tokens: u64,
        steps: u64,
    },
    Weighed {
        fragment: usize,
        hash: ContentHash,
        losses: Losses,
        /// The margin it was asked with (`proto::Output::Weigh`).
        margin: f64,
    },
    /// Progress after an inner step (sent when the channel has room; may be skipped).
    Step {
        step: u64,
        tokens: u64,
        /// The training loss, when this step read it back (see `train::StepStats`).
        loss: Option<f32>,
        tokens_per_s: f64,
    },
    /// A validation pass (also appended to `metrics.jsonl`).
    Validation(MetricsRecord),
    /// The step target was reached; the thread keeps answering commands.
    Trained {
        step: u64,
    },
    /// Final evaluation after [`ToWorker::Finish`]; the thread has ended.
    Finished {
        step: u64,
        tokens: u64,
        val_loss: f64,
        val_bpb: f64,
    },
    /// Training cannot go on (diverged, ...). A full disk is not a reason: checkpoint and
    /// metrics failures are logged and training goes on.
    Failed(String),
}

/// What the training thread needs besides the trainer.
pub struct WorkerSetup {
    pub trainer: Trainer,
    pub plan: FragmentPlan,
    pub corpus: Corpus,
    pub run_dir: PathBuf,
    /// Stop training at this step (`None`: until told to finish).
    pub target_step: Option<u64>,
    pub checkpoint_every: u64,
    /// Wait for [`ToWorker::Start`] before the first step.
    pub hold: bool,
    /// An emulated slower machine: each inner step takes this many times its compute time.
    pub slowdown: Slowdown,
}

/// Runs the trainer until [`ToWorker::Finish`] or the command channel closes. Between two
/// steps it only drains commands; once trained (or while held) it waits for them. A real
/// peer runs this on a thread of its own, a test on a paused runtime as one of its tasks
/// ([`Running::start`]), so that the runtime's clock sees each step's pace (`super::clock`).
pub async fn run(
    mut s: WorkerSetup,
    mut cmds: mpsc::Receiver<ToWorker>,
    out: mpsc::Sender<FromWorker>,
) {
    let mut w = Worker {
        since: vec![(0, 0); s.plan.len()],
        window: SinceValidation::new(),
        log: MetricsLog::new(&s.run_dir),
        started: Instant::now(),
    };
    let mut trained = s.target_step.is_some_and(|t| s.trainer.state().step >= t);
    if trained {
        let _ = out.send(FromWorker::Trained { step: s.trainer.state().step }).await;
    }
    let mut held = s.hold;
    loop {
        let cmd = if trained || held {
            cmds.recv().await
        } else {
            match cmds.try_recv() {
                Ok(cmd) => Some(cmd),
                Err(mpsc::error::TryRecvError::Empty) => {
                    if let Err(e) = w.step(&mut s, &out).await {
                        let _ = out.send(FromWorker::Failed(e)).await;
                        return;
                    }
                    let step = s.trainer.state().step;
                    if s.target_step.is_some_and(|t| step >= t) {
                        trained = true;
                        let _ = out.send(FromWorker::Trained { step }).await;
                    }
                    continue;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => None,
            }
        };
        match cmd {
            None | Some(ToWorker::Finish) => return finish(&mut s, &out).await,
            Some(ToWorker::Start) => held = false,
            Some(ToWorker::StopTraining) => {
                if !trained {
                    trained = true;
                    save(&s);
                    let _ = out.send(FromWorker::Trained { step: s.trainer.state().step }).await;
                }
            }
            Some(cmd) => {
                if let Err(e) = w.command(&mut s, cmd, &out).await {
                    let _ = out.send(FromWorker::Failed(e)).await;
                    return;
                }
            }
        }
    }
}

/// A running trainer, to wait for at the end.
pub enum Running {
    Thread(std::thread::JoinHandle<()>),
    Task(tokio::task::JoinHandle<()>),
}

impl Running {
    /// Starts [`run`] where `clock` says: a task of the current runtime, or a thread of its
    /// own at a lowered CPU priority with a runtime of its own (timers only).
    pub fn start(
        clock: &Clock,
        s: WorkerSetup,
        cmds: mpsc::Receiver<ToWorker>,
        out: mpsc::Sender<FromWorker>,
    ) -> std::io::Result<Running> {
        if clock.trains_on_runtime() {
            return Ok(Running::Task(tokio::spawn(run(s, cmds, out))));
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
        let thread = std::thread::Builder::new().name("atoll-trainer".into()).spawn(move || {
            super::priority::lower_this_thread();
            rt.block_on(run(s, cmds, out));
        })?;
        Ok(Running::Thread(thread))
    }

    /// Waits for the trainer to end (it ends once its command channel is closed).
    pub async fn join(self) {
        match self {
            Running::Thread(t) => {
                let _ = t.join();
            }
            Running::Task(t) => {
                let _ = t.await;
            }
        }
    }
}

struct Worker {
    /// Tokens and steps since the last snapshot, per fragment.
    since: Vec<(u64, u64)>,
    window: SinceValidation,
    log: MetricsLog,
    started: Instant,
}

/// Training loss and throughput since the last validation.
struct SinceValidation {
    loss: LossMean,
    tokens: u64,
    start: Instant,
}

impl SinceValidation {
    fn new() -> Self {
        Self { loss: LossMean::default(), tokens: 0, start: Instant::now() }
    }

    /// Adds a loss reading of the trainer; a non-finite one means training diverged.
    fn add_loss(&mut self, step: u64, reading: (Option<f32>, u32)) -> Result<(), String> {
        let diverged = |loss| format!("training diverged by step {step} (loss {loss})");
        self.loss.add(reading).map_err(diverged)
    }

    fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.start.elapsed().as_secs_f64().max(1e-9)
    }
}

impl Worker {
    async fn command(
        &mut self,
        s: &mut WorkerSetup,
        cmd: ToWorker,
        out: &mpsc::Sender<FromWorker>,
    ) -> Result<(), String> {
        match cmd {
            ToWorker::Snapshot { fragment, round } => {
                let spec = s.plan.fragments.get(fragment).ok_or("snapshot of no fragment")?;
                let params = read_fragment(s.trainer.model(), spec).map_err(|e| e.to_string())?;
                let (tokens, steps) = std::mem::take(&mut self.since[fragment]);
                let msg = FromWorker::Snapshot { fragment, round, params, tokens, steps };
                out.send(msg).await.map_err(|_| "node stopped".to_string())
            }
            ToWorker::Apply(a) => apply(s, &a),
            ToWorker::Weigh { fragment, hash, anchor, own, margin } => {
                let spec = s.plan.fragments.get(fragment).ok_or("weighing of no fragment")?;
                let losses = weigh(&mut s.trainer, spec, &anchor, &own)?;
                let msg = FromWorker::Weighed { fragment, hash, losses, margin };
                out.send(msg).await.map_err(|_| "node stopped".to_string())
            }
            ToWorker::Finish | ToWorker::StopTraining | ToWorker::Start => Ok(()), // the loop's
        }
    }

    async fn step(
        &mut self,
        s: &mut WorkerSetup,
        out: &mpsc::Sender<FromWorker>,
    ) -> Result<(), String> {
        // The runtime's clock: on a paused one, a step computes in no time and lasts its
        // floor.
        let computing = tokio::time::Instant::now();
        let stats = s.trainer.step().map_err(|e| format!("cannot read training data: {e}"))?;
        // Before the commands are looked at again: a slow machine answers at its own step
        // boundaries (see `slowdown`).
        let pause = s.slowdown.pause(computing.elapsed());
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let step = s.trainer.state().step;
        tracing::trace!(step, ms = computing.elapsed().as_millis(), "inner step");
        for c in &mut self.since {
            c.0 += stats.tokens as u64;
            c.1 += 1;
        }
        self.window.tokens += stats.tokens as u64;
        self.window.add_loss(step, (stats.loss, stats.losses))?;
        let tokens_per_s = self.window.tokens_per_s();
        let tokens = s.trainer.state().tokens;
        let _ = out.try_send(FromWorker::Step { step, tokens, loss: stats.loss, tokens_per_s });
        let last = s.target_step.is_some_and(|t| step >= t);
        if step % s.trainer.config().val_every == 0 || last {
            self.window.add_loss(step, s.trainer.read_loss())?;
            let val_loss = s.trainer.evaluate();
            let record = MetricsRecord {
                step,
                tokens: s.trainer.state().tokens,
                train_loss: self.window.loss.mean(),
                val_loss,
                val_bpb: bits_per_byte(val_loss),
                tokens_per_s,
                wall_s: self.started.elapsed().as_secs_f64(),
            };
            // Like a checkpoint, the learning curve is not worth stopping training for (a
            // full disk); the record still goes to the node's status.
            if let Err(e) = self.log.append(&record) {
                let path = s.run_dir.join(crate::metrics::FILE_NAME);
                tracing::warn!(
                    step, path = %path.display(), error = %e,
                    "cannot append to metrics.jsonl; training goes on"
                );
            }
            let _ = out.try_send(FromWorker::Validation(record));
            self.window = SinceValidation::new();
        }
        if step % s.checkpoint_every == 0 || last {
            save(s);
        }
        Ok(())
    }
}

/// `θ ← α·θ + (1−α)·anchor` for one fragment.
fn apply(s: &mut WorkerSetup, a: &ApplyAnchor) -> Result<(), String> {
    let spec = s.plan.fragments.get(a.fragment).ok_or("anchor of no fragment")?;
    let mut values = if a.alpha > 0.0 {
        let mut theta = read_fragment(s.trainer.model(), spec).map_err(|e| e.to_string())?;
        for (t, &x) in theta.iter_mut().zip(&a.anchor) {
            *t = a.alpha * *t + (1.0 - a.alpha) * x;
        }
        theta
    } else {
        a.anchor.clone()
    };
    values.truncate(spec.numel());
    write_fragment(s.trainer.model_mut(), spec, &values).map_err(|e| e.to_string())
}

/// The validation loss with the fragment `spec` set to `anchor`, and set to `own`, on the
/// same batches; the fragment's parameters are put back afterwards.
fn weigh(
    t: &mut Trainer,
    spec: &FragmentSpec,
    anchor: &[f32],
    own: &[f32],
) -> Result<Losses, String> {
    let n = spec.numel();
    let theta = read_fragment(t.model(), spec).map_err(|e| e.to_string())?;
    let mut loss = |values: &[f32]| -> Result<f64, String> {
        let values = values.get(..n).ok_or("an anchor shorter than its fragment")?;
        write_fragment(t.model_mut(), spec, values).map_err(|e| e.to_string())?;
        Ok(t.evaluate())
    };
    let offered = loss(anchor);
    let own = loss(own);
    write_fragment(t.model_mut(), spec, &theta).map_err(|e| e.to_string())?;
    Ok(Losses { offered: offered?, own: own? })
}

/// Writes a checkpoint; a failure (full disk) is logged and training goes on. The previous
/// checkpoint stays as it was (`checkpoint::write_atomic`), and the next save tries again.
fn save(s: &WorkerSetup) {
    let shard = s.trainer.dataset().shard();
    if let Err(e) = checkpoint::save(&s.trainer, shard, &s.corpus, &s.run_dir) {
        // The error names the checkpoint's path and the cause ("No space left on device").
        let step = s.trainer.state().step;
        tracing::error!(step, error = %e, "cannot write checkpoint; training goes on");
    }
}

async fn finish(s: &mut WorkerSetup, out: &mpsc::Sender<FromWorker>) {
    save(s);
    let val_loss = s.trainer.evaluate();
    let state = s.trainer.state();
    let (step, tokens) = (state.step, state.tokens);
    let val_bpb = bits_per_byte(val_loss);
    let _ = out.send(FromWorker::Finished { step, tokens, val_loss, val_bpb }).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::data::Shard;
    use crate::model::params::tensor_specs;
    use crate::train::TrainConfig;

    /// Weighing a state evaluates both anchors on the same data and leaves the model as it
    /// was; a poisoned anchor comes out worse, the own anchor as what `evaluate` gives.
    #[test]
    fn weighing_a_state_leaves_the_model_as_it_was() {
        let corpus = Corpus::embedded().unwrap();
        let config = TrainConfig::tiny(3);
        let mut t = Trainer::new(config, Backend::default(), &corpus, Shard::WHOLE).unwrap();
        for _ in 0..3 {
            t.step().unwrap();
        }
        let plan = FragmentPlan::new(&tensor_specs(t.model()), 2).unwrap();
        let spec = &plan.fragments[1];
        let theta = read_fragment(t.model(), spec).unwrap();
        let before = t.evaluate();
        let poisoned: Vec<f32> = theta.iter().map(|x| -20.0 * x).collect();
        let l = weigh(&mut t, spec, &poisoned, &theta).unwrap();
        assert_eq!(read_fragment(t.model(), spec).unwrap(), theta, "the model was changed");
        assert_eq!(l.own, before);
        assert!(l.offered > 1.1 * l.own && !l.passes(crate::proto::WORSE_MARGIN), "{l:?}");
        assert!(weigh(&mut t, spec, &theta[..3], &theta).is_err(), "a short anchor was weighed");
        assert_eq!(read_fragment(t.model(), spec).unwrap(), theta);
    }
}
