//! The real node code (event loop, effects, fetch tasks, trainer thread, checkpoints and
//! anchors on disk) driven in one process over [`atoll::node::memnet::MemSwarm`]: a
//! restart, a late join and a partition, no processes and no sockets. Each test ends with
//! every peer holding the same anchors and no honest peer reported by another.
//!
//! They run on virtual time: each scenario's runtime starts with its clock paused, and the
//! nodes read that clock and train on it ([`Clock::runtime`]), so every inner step lasts
//! its floor ([`STEP`], the rounds' nominal step) and computes in no time, whatever the
//! CPU and whatever else runs beside. Seconds of rounds take the CPU time of their steps;
//! each test prints both.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use atoll::backend::Backend;
use atoll::data::{Corpus, Shard};
use atoll::manifest::Manifest;
use atoll::node::memnet::MemSwarm;
use atoll::node::{self, Clock, NodeError, NodeOptions, NodeReport};
use atoll::rundir::status::{self, TrainingStatus};
use atoll::train::TrainConfig;
use atoll_net::{Keypair, NetConfig, PeerId};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const POLL: Duration = Duration::from_millis(50);
/// Every inner step's length on the virtual clock: the rounds' nominal step, so a round
/// of the tiny protocol (h 10) is ten steps.
const STEP: Duration = Duration::from_millis(20);

/// The tiny model with rounds of 200 ms (h 10 × 20 ms), epoch now on `clock`.
fn manifest(name: &str, clock: Clock) -> Manifest {
    let mut train = TrainConfig::tiny(11);
    train.val_every = 1_000;
    train.schedule.decay_steps = 2_000;
    let mut m = common::tiny_manifest(name, train);
    assert_eq!(m.protocol.step_ms as u128, STEP.as_millis(), "the rounds' nominal step");
    m.epoch_unix_ms = clock.unix_ms();
    m
}

/// The steps a peer takes in `d` of virtual time.
fn steps_for(d: Duration) -> u64 {
    (d.as_millis() / STEP.as_millis()) as u64
}

/// How long `steps` steps may take on the virtual clock before a wait fails: the steps
/// themselves, the time to finish (merging until the swarm is quiet) and a margin. Only
/// the protocol's timing counts here, not the machine's speed.
fn deadline_for(steps: u64) -> Duration {
    STEP * steps as u32 * 2 + Duration::from_secs(30)
}

/// One scenario's medium, run, clock (one for all its peers: a restarted peer reads the
/// same time as the others) and directory.
struct Scenario {
    swarm: MemSwarm,
    manifest: Manifest,
    clock: Clock,
    dir: tempfile::TempDir,
}

impl Scenario {
    /// Called on the scenario's runtime (its clock is the runtime's).
    fn new(name: &str) -> Scenario {
        let clock = Clock::runtime();
        let dir = tempfile::tempdir().unwrap();
        Scenario { swarm: MemSwarm::new(), manifest: manifest(name, clock), clock, dir }
    }

    fn start(&self, index: u32, count: u32, steps: u64) -> Peer {
        Peer::start(self, index, count, steps)
    }
}

/// One node running as a task of this process.
struct Peer {
    name: String,
    dir: PathBuf,
    id: PeerId,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<NodeReport, NodeError>>>,
}

impl Peer {
    /// Starts peer `index` of `count` (its key is derived from `index`, so a restart keeps
    /// its id) in the scenario's `peer-INDEX`, training to `steps`.
    fn start(sc: &Scenario, index: u32, count: u32, steps: u64) -> Peer {
        let (swarm, m) = (&sc.swarm, &sc.manifest);
        let key = Keypair::ed25519_from_bytes([index as u8 + 1; 32]).unwrap();
        let id = key.public().to_peer_id();
        let dir = sc.dir.path().join(format!("peer-{index}"));
        let opts = NodeOptions {
            manifest: m.clone(),
            corpus: Corpus::embedded().unwrap(),
            run_dir: dir.clone(),
            shard: Shard { index, count },
            backend: Backend::default(),
            micro_batch: 0,
            net: NetConfig::new(key, m.name.clone()),
            target_step: Some(steps),
            duration: None,
            checkpoint_every: 50,
            on_listening: None,
            board: None,
            slowdown: node::Slowdown::NONE.with_floor(STEP).unwrap(),
            clock: sc.clock,
        };
        let (net, events) = swarm.join(id);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(node::run_on(opts, net, events, async move {
            let _ = stopped.await;
        }));
        Peer { name: format!("peer {index}"), dir, id, stop: Some(stop), task: Some(task) }
    }

    fn training(&self) -> Option<TrainingStatus> {
        status::read(&self.dir.join(status::FILE_NAME)).ok()?.training
    }

    /// Polls the peer's status file until `ok` holds; panics after `within`.
    async fn wait_until(
        &self,
        what: &str,
        within: Duration,
        mut ok: impl FnMut(&TrainingStatus) -> bool,
    ) -> TrainingStatus {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(t) = self.training().filter(|t| ok(t)) {
                return t;
            }
            if self.task.as_ref().is_some_and(|t| t.is_finished()) {
                panic!("{} ended while waiting for: {what}", self.name);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: timed out after {within:?} waiting for: {what}",
                self.name
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits for the node to end by itself (trained, swarm quiet).
    async fn report(&mut self, within: Duration) -> NodeReport {
        let task = self.task.take().expect("running");
        match tokio::time::timeout(within, task).await {
            Ok(Ok(Ok(report))) => report,
            Ok(Ok(Err(e))) => panic!("{} failed: {e}", self.name),
            Ok(Err(e)) => panic!("{} panicked: {e}", self.name),
            Err(_) => panic!("{} did not finish within {within:?}", self.name),
        }
    }

    /// Tells the node to stop (it applies its anchors, evaluates, checkpoints and ends).
    async fn stop(&mut self, swarm: &MemSwarm) -> NodeReport {
        let _ = self.stop.take().expect("running").send(());
        let report = self.report(Duration::from_secs(60)).await;
        swarm.leave(self.id);
        report
    }
}

/// Runs one scenario on a single-threaded runtime whose clock starts paused (virtual time),
/// and prints how much virtual time it took in how much real time.
fn on_virtual_time(name: &str, scenario: impl std::future::Future<Output = ()>) {
    let mut rt = tokio::runtime::Builder::new_current_thread();
    let rt = rt.enable_all().start_paused(true).build().expect("a tokio runtime");
    let (real, start) =
        (std::time::Instant::now(), rt.block_on(async { tokio::time::Instant::now() }));
    rt.block_on(scenario);
    let simulated = rt.block_on(async { tokio::time::Instant::now() }) - start;
    eprintln!(
        "{name}: {simulated:.1?} on the virtual clock in {:.1?} of real time",
        real.elapsed()
    );
}

/// Waits for every peer to end by itself; their reports, in order.
async fn finish_all(peers: &mut [Peer], within: Duration) -> Vec<NodeReport> {
    let mut reports = Vec::new();
    for p in peers {
        reports.push(p.report(within).await);
    }
    reports
}

fn min_round(t: &TrainingStatus) -> u64 {
    t.round.iter().copied().min().unwrap_or(0)
}

/// Every report holds the same anchors, and no peer reported another.
fn assert_agreement(swarm: &MemSwarm, peers: &[Peer], reports: &[NodeReport]) {
    for (p, r) in peers.iter().zip(reports) {
        assert_eq!(
            r.anchor_hashes, reports[0].anchor_hashes,
            "{} ended on other anchors than {}",
            p.name, peers[0].name
        );
        assert!(
            swarm.reports_about(p.id).is_empty(),
            "honest {} was reported: {:?}",
            p.name,
            swarm.reports_about(p.id)
        );
    }
}

#[test]
fn a_restarted_peer_resumes_from_disk_and_the_swarm_agrees() {
    on_virtual_time("restart", async {
        let sc = Scenario::new("in-process-restart");
        // Peer 0 stops after five rounds (1 s) and the others train on past its restart.
        let steps = steps_for(Duration::from_secs(5));
        let mut peers: Vec<Peer> = (0..3).map(|i| sc.start(i, 3, steps)).collect();
        for p in &peers {
            p.wait_until("5 rounds merged", Duration::from_secs(60), |t| {
                t.merges >= 5 && t.step >= 60
            })
            .await;
        }
        let before = peers[0].stop(&sc.swarm).await;
        assert!(before.step >= 60 && before.step < steps, "stopped at step {}", before.step);
        peers[0] = sc.start(0, 3, steps);
        let t = peers[0]
            .wait_until("trains again", Duration::from_secs(30), |t| t.step > before.step)
            .await;
        assert!(t.tokens_at_start > 0, "the restarted peer did not resume from its checkpoint");
        peers[0].wait_until("merges again", Duration::from_secs(30), |t| t.merges >= 3).await;
        let reports = finish_all(&mut peers, deadline_for(steps)).await;
        assert!(
            reports.iter().all(|r| r.step == steps),
            "steps {:?}",
            reports.iter().map(|r| r.step).collect::<Vec<_>>()
        );
        assert_agreement(&sc.swarm, &peers, &reports);
    });
}

#[test]
fn a_late_joiner_takes_the_swarms_anchors_then_trains() {
    on_virtual_time("late join", async {
        let sc = Scenario::new("in-process-late");
        // The first two train on past ten rounds (2 s) and the joiner's start.
        let steps = steps_for(Duration::from_secs(6));
        let mut peers: Vec<Peer> = (0..2).map(|i| sc.start(i, 3, steps)).collect();
        for p in &peers {
            p.wait_until("10 rounds", Duration::from_secs(60), |t| {
                t.merges >= 10 && min_round(t) >= 6
            })
            .await;
        }
        let swarm_round = min_round(&peers[1].training().unwrap());
        peers.push(sc.start(2, 3, 200));
        let t =
            peers[2].wait_until("first inner step", Duration::from_secs(30), |t| t.step > 0).await;
        assert!(
            t.join_rounds.iter().all(|&r| r + 1 >= swarm_round),
            "started training at rounds {:?} while the swarm was at round {swarm_round}",
            t.join_rounds
        );
        let reports = finish_all(&mut peers, deadline_for(steps)).await;
        assert_agreement(&sc.swarm, &peers, &reports);
    });
}

#[test]
fn a_healed_partition_ends_in_agreement() {
    on_virtual_time("healed partition", async {
        let sc = Scenario::new("in-process-partition");
        // Every peer trains on past three rounds together and four apart (1.4 s).
        let steps = steps_for(Duration::from_secs(5));
        let mut peers: Vec<Peer> = (0..4).map(|i| sc.start(i, 4, steps)).collect();
        for p in &peers {
            p.wait_until("3 rounds merged", Duration::from_secs(60), |t| t.merges >= 3).await;
        }
        let ids: Vec<PeerId> = peers.iter().map(|p| p.id).collect();
        sc.swarm.split(&[&ids[..2], &ids[2..]]);
        // Apart, each side merges on its own and the two lineages differ.
        let apart = min_round(&peers[0].training().unwrap()) + 4;
        let mut sides = Vec::new();
        for p in &peers {
            let t = p
                .wait_until("4 rounds apart", Duration::from_secs(60), |t| min_round(t) >= apart)
                .await;
            sides.push(t.anchor_hashes);
        }
        assert_ne!(sides[0], sides[2], "the two sides of the partition did not diverge");
        sc.swarm.heal();
        // Neither side holds most of the voters: a side comes over to the ruling lineage's
        // state, which no majority holds, so its trainer weighs it first (and the node
        // carries the weighing to the trainer and back).
        let weighed = |p: &Peer| p.training().map_or(0, |t| t.weighed);
        let reports = finish_all(&mut peers, deadline_for(steps)).await;
        assert_agreement(&sc.swarm, &peers, &reports);
        let total: u64 = peers.iter().map(weighed).sum();
        assert!(total > 0, "the healed sides came together without weighing a state");
    });
}
