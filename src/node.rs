//! A training peer: the trainer on its own thread, the protocol core and `atoll-net`,
//! joined by one event loop (STYLE: one task owns the state, the rest talk to it).
//!
//! ```text
//!  worker thread ──Snapshot/Step/Validation──▶ event loop ──Publish/Fetch──▶ atoll-net
//!        ▲                                    │  (owns Protocol)                 │
//!        └──────────Snapshot?/Apply───────────┘ ◀──Announcement/blob bytes──────┘
//! ```
//!
//! The trainer never waits on the network: it drains its command channel between steps.
//! Time on the run's timeline is `unix_ms − manifest.epoch_unix_ms`, so all peers share
//! the round schedule. A fresh peer joining a swarm that has merged takes its anchors
//! before the first step. A peer that reached its step target (or `duration`) stays,
//! merging the others' deltas, until no fragment changed for a period plus the grace cap
//! (the swarm is quiet), then applies its final anchors, evaluates them and exits.
//! Tests may run nodes on a paused runtime's virtual clock instead of the system's
//! ([`Clock`]); the trainer is then a task of that runtime.

mod clock;
mod disk;
mod effects;
mod error;
mod event_loop;
mod fetches;
mod finish;
pub mod heartbeats;
mod inputs;
pub mod memnet;
pub mod network;
mod observer;
mod outbox;
pub mod priority;
mod setup;
pub mod slowdown;
pub mod wire;
pub mod worker;

pub use clock::Clock;
pub use error::NodeError;
pub use network::Network;
pub use observer::serve_without_training;
use outbox::WorkerOutbox;
pub use setup::{initial_anchors, proto_peer};
use setup::{open, Opened};
pub use slowdown::Slowdown;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::path::PathBuf;

use std::time::Duration;

use atoll_net::logthrottle::LogThrottle;
use atoll_net::{NetConfig, NetEvent, Node};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::backend::Backend;
use crate::data::{Corpus, Shard};

use crate::manifest::{Manifest, RunId};
use crate::peer::Peer;
use crate::proto::{Millis, PeerId, Timer};
use crate::rundir::ledger;
use crate::rundir::status::TrainingStatus;
use worker::WorkerSetup;

/// How often `status.json` is rewritten (training and `--no-train` peers alike).
const STATUS_PERIOD: Duration = Duration::from_millis(500);

/// Most background tasks (publishes, manifest diagnoses) at once.
const MAX_TASKS: usize = 256;
/// How long background tasks may take to finish at shutdown.
const SETTLE: Duration = Duration::from_secs(2);

/// Told this peer's id and listen addresses once the network listens.
pub type OnListening = Box<dyn FnOnce(atoll_net::PeerId, &[atoll_net::Multiaddr]) + Send>;

/// Everything a training peer needs.
pub struct NodeOptions {
    pub manifest: Manifest,
    pub corpus: Corpus,
    pub run_dir: PathBuf,
    pub shard: Shard,
    pub backend: Backend,
    /// Rows per forward and backward pass (0: each step's whole batch at once); see
    /// [`crate::train::Trainer::set_micro_batch`]. A local choice, not the run's.
    pub micro_batch: usize,
    /// Network settings; `run_name` is replaced by the manifest's name.
    pub net: NetConfig,
    /// Inner steps to train (in total, counting a resumed run's earlier steps).
    pub target_step: Option<u64>,
    /// Train for this long, then finish as at the step target (merge until the swarm is
    /// quiet, evaluate, exit).
    pub duration: Option<Duration>,
    pub checkpoint_every: u64,
    /// Called once the network listens, with this peer's id and listen addresses (the
    /// command line prints them for others to bootstrap from).
    pub on_listening: Option<OnListening>,
    /// The status page's and metrics' board (`--http`, `--metrics-addr`), fed with each
    /// status and each step's loss; `None` when neither is served.
    pub board: Option<crate::web::Board>,
    /// Emulate a slower machine (`--slowdown`): each inner step takes this many times its
    /// compute time. [`Slowdown::NONE`] for full speed.
    pub slowdown: Slowdown,
    /// The system clock ([`Clock::System`]) for a real peer; tests may run on a paused
    /// runtime's.
    pub clock: Clock,
}

/// How a node ended.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeReport {
    pub step: u64,
    pub tokens: u64,
    pub final_val_loss: f64,
    pub final_val_bpb: f64,
    pub anchor_hashes: Vec<String>,
}

/// Runs a training peer on atoll-net until it is done, told to stop (`stop` resolves), or
/// fails.
pub async fn run(
    mut opts: NodeOptions,
    stop: impl std::future::Future<Output = ()>,
) -> Result<NodeReport, NodeError> {
    // Configuration, checkpoint and anchors are checked before any socket is opened.
    let opened = open(&opts)?;
    opts.net.run_name = opts.manifest.name.clone();
    // The manifest's blob hash is its run id: joiners learn it in identify, then fetch it.
    opts.net.manifest = Some(atoll_net::BlobHash(opts.manifest.run_id().0));
    let mut node = Node::start(opts.net.clone()).await?;
    if let Some(tell) = opts.on_listening.take() {
        tell(node.client.peer_id(), &node.listen_addrs);
    }
    let result = serve(opts, opened, node.client.clone(), &mut node.events, stop).await;
    node.handle.shutdown().await?;
    result
}

/// Runs a training peer on any [`Network`] (tests run several over a
/// [`memnet::MemSwarm`] in one process); otherwise as [`run`].
pub async fn run_on<N: Network>(
    opts: NodeOptions,
    net: N,
    mut events: mpsc::Receiver<NetEvent>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<NodeReport, NodeError> {
    let opened = open(&opts)?;
    serve(opts, opened, net, &mut events, stop).await
}

/// The event loop of an opened peer, from the first step to the final status file.
async fn serve<N: Network>(
    opts: NodeOptions,
    opened: Opened,
    net: N,
    events: &mut mpsc::Receiver<NetEvent>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<NodeReport, NodeError> {
    let Opened { trainer, fresh, plan, proto, period, started_unix_ms } = opened;
    net.put_blob(Bytes::from(opts.manifest.to_bytes()))?;
    tracing::info!(
        run = %opts.manifest.name, manifest = %opts.manifest.run_id(), params = plan.numel(),
        step = trainer.state().step, shard = ?opts.shard, slowdown = %opts.slowdown,
        micro_batch = opts.micro_batch, "training peer started"
    );

    // A resumed peer reports its checkpoint's progress from its first status file on.
    let (resumed_step, resumed_tokens) = (trainer.state().step, trainer.state().tokens);
    // A fresh peer joining a swarm that has merged already first takes the swarm's anchors
    // (from several donors at once), then trains: steps on the initial parameters would be
    // wasted, and their delta would pull the swarm back.
    let run_ms = started_unix_ms.saturating_sub(opts.manifest.epoch_unix_ms);
    let late = fresh && (0..plan.len()).any(|p| proto.schedule().current_round(p, run_ms) > 1);
    let (to_worker, worker_rx) = mpsc::channel(256);
    let (worker_tx, from_worker) = mpsc::channel(256);
    let setup = WorkerSetup {
        trainer,
        plan: plan.clone(),
        corpus: opts.corpus.clone(),
        run_dir: opts.run_dir.clone(),
        target_step: opts.target_step,
        checkpoint_every: opts.checkpoint_every.max(1),
        hold: late,
        slowdown: opts.slowdown,
    };
    let endpoints = opts.board.as_ref().map(|b| b.endpoints()).unwrap_or_default();
    let disk = disk::Disk::start(opts.run_dir.clone(), endpoints).map_err(NodeError::Thread)?;
    let worker = worker::Running::start(&opts.clock, setup, worker_rx, worker_tx)
        .map_err(NodeError::Thread)?;

    let proto_id = ledger::peer_hex(proto_peer(&net.peer_id()));
    let raw = proto.settings().raw();
    let delta_bytes_per_period = plan
        .fragments
        .iter()
        .filter_map(|f| crate::delta::max_encoded_len(f.numel(), &raw.encode))
        .map(|n| n as u64)
        .sum();
    let grace_ms = raw.grace_cap_ms;
    let mut lp = Loop {
        epoch: opts.manifest.epoch_unix_ms,
        run_id: opts.manifest.run_id(),
        manifest: opts.manifest.clone(),
        net,
        peer: Peer::new(proto, period, late.then_some(run_ms)),
        timers: BinaryHeap::new(),
        peers: HashMap::new(),
        fetches: fetches::Fetches::default(),
        tasks: JoinSet::new(),
        disk,
        foreign: HashSet::new(),
        reported: LogThrottle::new(LogThrottle::<PeerId>::DEFAULT_WINDOW, 4096),
        to_worker: WorkerOutbox::new(to_worker),
        status: TrainingStatus {
            run_id: opts.manifest.run_id().short(),
            target_step: opts.target_step,
            step: resumed_step,
            tokens: resumed_tokens,
            tokens_at_start: resumed_tokens,
            proto_id,
            backend: opts.backend.name().to_owned(),
            param_count: plan.numel(),
            period_ms: period,
            grace_ms,
            delta_bytes_per_period,
            ..TrainingStatus::default()
        },
        beacon: heartbeats::Beacon::new(opts.clock.unix_ms()),
        clock: opts.clock,
        started_unix_ms,
        allow: opts.net.allow.clone(),
        board: opts.board.clone(),
    };
    if late {
        tracing::info!("joining a running swarm: fetching its anchors before training");
    }
    let result = lp.drive(events, from_worker, opts.duration, stop).await;
    lp.fetches.shutdown();
    // Closing the command channel ends a worker that is still running (after an error).
    lp.to_worker.close();
    worker.join().await;
    lp.settle().await;
    let Loop { net, disk, status, beacon, board, clock, .. } = lp;
    if let Ok(stats) = net.stats().await {
        disk.write_swarm(beacon.view(&net.peer_id(), clock.unix_ms()));
        if let Some(b) = &board {
            b.set_status(false, stats.clone(), Some(status.clone()));
        }
        disk.write_status(false, stats, status);
    }
    disk.finish();
    result
}

struct Loop<N> {
    epoch: u64,
    run_id: RunId,
    manifest: Manifest,
    net: N,
    /// The protocol core and every decision around it (I/O-free).
    peer: Peer,
    timers: BinaryHeap<Reverse<(Millis, Timer)>>,
    /// libp2p ids behind the protocol's peer ids.
    peers: HashMap<PeerId, atoll_net::PeerId>,
    fetches: fetches::Fetches,
    /// Announcements being published and foreign manifests being diagnosed; awaited (for
    /// a moment) at shutdown.
    tasks: JoinSet<()>,
    /// Fragment states, status and merge records on their way to disk.
    disk: disk::Disk,
    /// (peer, run id) pairs of foreign messages already explained in the log.
    foreign: HashSet<(atoll_net::PeerId, [u8; 32])>,
    /// Offences logged: one line per offender and offence per minute (the counts go to
    /// status.json whatever the log says).
    reported: LogThrottle<PeerId>,
    to_worker: WorkerOutbox,
    status: TrainingStatus,
    started_unix_ms: u64,
    /// The run's allow list (`None`: an open run).
    allow: Option<HashSet<atoll_net::PeerId>>,
    /// Our heartbeats and the table of the run's peers from theirs.
    beacon: heartbeats::Beacon,
    /// What the status page and metrics show (`None`: not served).
    board: Option<crate::web::Board>,
    clock: Clock,
}
