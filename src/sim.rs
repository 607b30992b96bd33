//! Deterministic discrete-event simulator of a swarm driving the real protocol core
//! (DESIGN.md §3.5, STYLE.md habit 6).
//!
//! N peers with seeded speeds, clock skews, latency, upload bandwidth, loss, partitions,
//! crashes and restarts, each running an unmodified [`Peer`] — the protocol core and the
//! decisions around it that the node runs too (some of them hostile,
//! [`byzantine`]); training is a noisy quadratic ([`trainer`]). Everything random comes
//! from one seed, events at equal times run in insertion order, and nothing reads a clock,
//! so a run replays exactly from its seed: tests take it from the `SEED` environment
//! variable ([`seed_from_env`]).

mod attack;
pub mod byzantine;
mod config;
pub mod net;
pub mod observe;
pub mod queue;
pub mod trainer;

use crate::delta::ContentHash;
use crate::fragment::FragmentPlan;
use crate::peer::Peer;
use crate::proto::{self, Event, FragmentState, PeerId, Protocol, Settings};
use byzantine::Hostiles;
use net::Net;
use observe::{Bytes, Lineages, Stats};
use queue::Queue;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use trainer::{Problem, Trainer};

pub use config::SimConfig;

/// The seed from `SEED` if set (to replay a failure), else `default`.
pub fn seed_from_env(default: u64) -> u64 {
    std::env::var("SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Events of the simulation.
#[derive(Debug)]
enum Ev {
    /// A protocol event for `peer`, valid only for incarnation `inc`.
    Proto { peer: usize, inc: u32, event: Event },
    /// The trainer of `peer` reaches the end of its current inner step and takes the
    /// snapshot the protocol asked for (a slow peer answers late, as a real one would).
    Snapshot { peer: usize, inc: u32, fragment: usize, round: u64 },
    /// `peer`'s clock decides something ([`Peer::poll`]).
    Poll { peer: usize, inc: u32 },
    /// The trainer of `peer` takes its last inner step ([`SimConfig::step_target`]).
    Trained { peer: usize, inc: u32 },
}

struct Slot {
    peer: Option<Peer>,
    trainer: Trainer,
    /// Bumped on crash and restart; events for older incarnations are dropped.
    inc: u32,
    skew: u64,
    /// Trainer steps at the previous snapshot of each fragment.
    snap_steps: Vec<u64>,
    /// The states saved at the crash (the checkpoint a restart resumes from).
    checkpoint: Vec<FragmentState>,
    /// The trainer waits: a late joiner not yet released, or a finished peer.
    held: bool,
    /// When the next [`Ev::Poll`] of this peer is due (`None`: none queued).
    poll_at: Option<u64>,
    /// What the peer's life brought: its release and its finish.
    life: Life,
}

/// When a peer was released and finished, in simulation time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Life {
    /// Its release as a late joiner: time, reason, and the inner steps taken before it.
    pub released: Option<(u64, crate::peer::Release, u64)>,
    /// When its trainer reached the step target.
    pub trained_at: Option<u64>,
    /// When it finished, and its anchors then (fragment by fragment, concatenated).
    pub finished: Option<(u64, Vec<f32>)>,
}

/// A running simulation.
pub struct Sim {
    cfg: SimConfig,
    settings: Settings,
    plan: FragmentPlan,
    /// Start of each fragment in the flat parameter vector.
    offsets: Vec<usize>,
    pub problem: Problem,
    slots: Vec<Slot>,
    queue: Queue<Ev>,
    net: Net,
    rng: ChaCha8Rng,
    now: u64,
    pub stats: Stats,
    pub bytes: Vec<Bytes>,
    pub lineages: Option<Lineages>,
    byz: Hostiles,
    /// The run's initial parameters (what a fresh joiner starts from).
    init: Vec<f32>,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sim({} peers, t={} ms, {:?})", self.slots.len(), self.now, self.queue)
    }
}

/// Why a simulation could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    #[error(transparent)]
    Settings(#[from] proto::SettingsError),
    #[error(transparent)]
    Plan(#[from] crate::fragment::PlanError),
    #[error(transparent)]
    Proto(#[from] proto::ProtoError),
}

mod drive;
mod lifecycle;

impl Sim {
    pub fn new(cfg: SimConfig) -> Result<Self, SimError> {
        let settings = Settings::new(cfg.settings.clone())?.with_tokens_per_step(cfg.batch_tokens);
        let plan = FragmentPlan::new(&cfg.tensors, cfg.settings.fragments)?;
        let mut offsets = Vec::with_capacity(plan.len());
        let mut at = 0;
        for f in &plan.fragments {
            offsets.push(at);
            at += f.numel();
        }
        let problem = Problem::new(plan.numel(), cfg.seed);
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        let init: Vec<f32> = (0..plan.numel()).map(|_| rng.random_range(-0.1f32..0.1)).collect();
        let setup =
            Setup { cfg: &cfg, settings: &settings, plan: &plan, offsets: &offsets, init: &init };
        let slots =
            (0..cfg.peers).map(|i| setup.slot(i, &mut rng)).collect::<Result<Vec<_>, _>>()?;
        let lineages = cfg.track_lineage.then(|| {
            let hashes: Vec<ContentHash> = slots
                .first()
                .map(|s| s.checkpoint.iter().map(FragmentState::hash).collect())
                .unwrap_or_default();
            Lineages::new(cfg.peers, &hashes)
        });
        let byz = Hostiles::new(cfg.peers, plan.len(), &cfg.hostile, cfg.seed);
        let mut sim = Self {
            byz,
            net: Net::new(cfg.net.clone(), cfg.peers),
            bytes: vec![Bytes::default(); cfg.peers],
            cfg,
            settings,
            plan,
            offsets,
            problem,
            slots,
            queue: Queue::default(),
            rng,
            now: 0,
            stats: Stats::default(),
            lineages,
            init,
        };
        for i in 0..sim.slots.len() {
            sim.start_peer(i);
        }
        Ok(sim)
    }

    /// Simulated time in ms.
    pub fn now(&self) -> u64 {
        self.now
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn peers(&self) -> usize {
        self.slots.len()
    }

    pub fn is_alive(&self, i: usize) -> bool {
        self.slots[i].peer.is_some()
    }

    pub fn protocol(&self, i: usize) -> Option<&Protocol> {
        self.slots[i].peer.as_ref().map(Peer::protocol)
    }

    /// Runs every event due up to `until` (ms).
    pub fn run_until(&mut self, until: u64) {
        while let Some((at, ev)) = self.queue.pop_until(until) {
            self.now = at;
            self.stats.events += 1;
            self.dispatch(ev);
        }
        self.now = until;
    }

    /// Runs `rounds` more fragment cycles.
    pub fn run_rounds(&mut self, rounds: u64) {
        let until = self.now + rounds * self.settings.period_ms();
        self.run_until(until);
    }

    /// Runs to just before the end of the `cycles`-th cycle from now, before any peer's
    /// clock (skewed ahead by up to `clock_skew_ms`) reaches the next open: every fragment
    /// has merged its latest round by then (when `T/P` exceeds the longest wait), so it is
    /// the moment to compare states.
    pub fn run_cycles(&mut self, cycles: u64) {
        let t = self.settings.period_ms();
        let margin = self.cfg.clock_skew_ms + 1;
        let end = ((self.now + margin) / t + cycles) * t;
        self.run_until(end.saturating_sub(margin).max(self.now));
    }

    /// Kills peer `i` now; it keeps its last states as a checkpoint.
    pub fn crash(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        if let Some(p) = slot.peer.take() {
            let p = p.protocol();
            slot.checkpoint = (0..self.plan.len()).map(|f| p.state(f).clone()).collect();
            slot.inc += 1;
        }
    }

    /// Restarts peer `i` from its checkpoint; it catches up by itself.
    pub fn restart(&mut self, i: usize) -> Result<(), SimError> {
        if self.slots[i].peer.is_some() {
            return Ok(());
        }
        let seed = self.rng.random();
        let slot = &mut self.slots[i];
        let states = slot.checkpoint.clone();
        for (p, s) in states.iter().enumerate() {
            let range = self.offsets[p]..self.offsets[p] + s.anchor.len();
            slot.trainer.theta[range].copy_from_slice(&s.anchor);
            if let Some(l) = self.lineages.as_mut() {
                l.restored(i, p, s.hash(), &mut self.stats);
            }
        }
        slot.trainer.resume_at(self.now);
        slot.snap_steps = vec![slot.trainer.steps; self.plan.len()];
        let restored =
            Protocol::restore(PeerId(i as u64), self.settings.clone(), &self.plan, states, seed)?;
        slot.peer = Some(Peer::new(restored, self.settings.period_ms(), None));
        slot.inc += 1;
        self.start_peer(i);
        Ok(())
    }

    /// Splits the swarm: `group[i]` is peer `i`'s side.
    pub fn partition(&mut self, groups: Vec<u8>) {
        self.net.set_groups(groups);
    }

    pub fn heal(&mut self) {
        self.net.heal();
    }

    /// Changes the loss probability from now on.
    pub fn set_loss(&mut self, loss: f64) {
        self.net.cfg.loss = loss;
    }

    /// Live peers' state hashes of fragment `p`, in peer order.
    pub fn state_hashes(&self, p: usize) -> Vec<ContentHash> {
        self.slots.iter().filter_map(|s| Some(s.peer.as_ref()?.protocol().state_hash(p))).collect()
    }

    /// Number of distinct states of fragment `p` among live peers (1 = agreement).
    pub fn distinct_states(&self, p: usize) -> usize {
        let mut h = self.state_hashes(p);
        h.sort();
        h.dedup();
        h.len()
    }

    /// Whether all live peers hold identical states of every fragment.
    pub fn agree(&self) -> bool {
        (0..self.plan.len()).all(|p| self.distinct_states(p) == 1)
    }

    /// Consensus distance of the full anchors of live peers.
    pub fn consensus_distance(&self) -> f64 {
        let anchors = self.anchors();
        let refs: Vec<&[f32]> = anchors.iter().map(Vec::as_slice).collect();
        proto::consensus_distance(&refs)
    }

    /// Mean global loss of the live peers' anchors.
    pub fn mean_anchor_loss(&self) -> f64 {
        let anchors = self.anchors();
        anchors.iter().map(|a| self.problem.loss(a)).sum::<f64>() / anchors.len().max(1) as f64
    }

    /// Mean payload bytes received per live peer per fragment round so far.
    pub fn payload_bytes_per_peer_round(&self) -> f64 {
        let rounds = (self.now / self.settings.period_ms()).max(1) * self.plan.len() as u64;
        let total: u64 = self.bytes.iter().map(|b| b.payload_received).sum();
        total as f64 / self.slots.len() as f64 / rounds as f64
    }

    fn anchors(&self) -> Vec<Vec<f32>> {
        self.slots
            .iter()
            .filter_map(|s| s.peer.as_ref().map(Peer::protocol))
            .map(|p| (0..self.plan.len()).flat_map(|f| p.state(f).anchor.iter().copied()).collect())
            .collect()
    }
}

/// What building a peer needs.
struct Setup<'a> {
    cfg: &'a SimConfig,
    settings: &'a Settings,
    plan: &'a FragmentPlan,
    offsets: &'a [usize],
    init: &'a [f32],
}

impl Setup<'_> {
    /// Peer `i`: its speed (the last `slow_fraction` are slowed), clock skew, trainer and
    /// protocol, all drawn from the run's rng in peer order.
    fn slot(&self, i: usize, rng: &mut ChaCha8Rng) -> Result<Slot, SimError> {
        let cfg = self.cfg;
        let slow_from = cfg.peers - (cfg.peers as f64 * cfg.slow_fraction).round() as usize;
        let (lo, hi) = cfg.speed_range;
        let mut speed = if hi > lo { rng.random_range(lo..hi) } else { lo };
        if i >= slow_from {
            speed *= cfg.slow_factor;
        }
        let step_ms = cfg.settings.step_ms as f64 * speed;
        let skew = if cfg.clock_skew_ms > 0 { rng.random_range(0..=cfg.clock_skew_ms) } else { 0 };
        let (lr, noise, het) = (cfg.inner_lr, cfg.noise, cfg.heterogeneity);
        let mut trainer =
            Trainer::new(self.init.to_vec(), het, step_ms, lr, noise, 0, rng.random());
        trainer.limit = cfg.step_target;
        let initial = split(self.plan, self.offsets, self.init);
        let me = PeerId(i as u64);
        let proto = Protocol::new(me, self.settings.clone(), self.plan, initial, rng.random())?;
        let checkpoint = (0..self.plan.len()).map(|p| proto.state(p).clone()).collect();
        let snap_steps = vec![0; self.plan.len()];
        let peer = Some(Peer::new(proto, self.settings.period_ms(), None));
        let (held, poll_at, life) = (false, None, Life::default());
        Ok(Slot { peer, trainer, inc: 0, skew, snap_steps, checkpoint, held, poll_at, life })
    }
}

/// Cuts a flat parameter vector into per-fragment buffers.
fn split(plan: &FragmentPlan, offsets: &[usize], flat: &[f32]) -> Vec<Vec<f32>> {
    plan.fragments.iter().zip(offsets).map(|(f, &o)| flat[o..o + f.numel()].to_vec()).collect()
}

/// Bytes of a gossip message on the wire.
fn gossip_len(msg: &proto::Message) -> u64 {
    proto::encode_message(msg).len() as u64
}
