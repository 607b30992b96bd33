//! One peer's decisions, I/O-free: the protocol core plus what a running peer decides
//! around it — holding a late joiner until it has the swarm's anchors, re-announcing its
//! states when a member joins, merging on after training until the swarm is quiet, then
//! finishing. Executors (the tokio node, the simulator) feed it [`PeerEvent`]s with the
//! time and carry out its [`Effect`]s; none of them decides any of this itself, so the
//! policies are tested here on virtual time. What it offers to others that fetch from
//! it (its states and own deltas) is in a store it owns ([`Offered`]).
//!
//! ```text
//!  trainer reports, run members, core events ──▶ Peer::handle ──▶ effects: core outputs,
//!  the clock ────────────────────────────────▶ Peer::poll         offers, release, finish
//! ```

mod store;

pub use store::Offered;

use crate::delta::ContentHash;
use crate::proto::{ApplyAnchor, Event, Message, Millis, Output, Protocol};
use bytes::Bytes;

/// A trained peer considers the swarm quiet when no fragment changed for a whole period
/// plus the grace cap plus this margin (every fragment then had a round with nothing to
/// merge), and never less than [`QUIET_MIN_MS`] (peers that start later get their turn).
pub const QUIET_MARGIN_MS: Millis = 1_000;
pub const QUIET_MIN_MS: Millis = 5_000;
/// How long after a run member connects this peer announces its states again for it:
/// soon (its gossip subscription comes with its first message, so it is usually there by
/// then), and once more later for a subscription that came late (slow links).
pub const REANNOUNCE_SOON_MS: Millis = 150;
pub const REANNOUNCE_LATE_MS: Millis = 1_000;
/// A joiner is caught up once each fragment's state is at most this many rounds behind
/// the round the run's clock is in (a merged state trails its open round by about one).
const MAX_ROUNDS_BEHIND_CLOCK: u64 = 2;

/// What happens to a peer.
#[derive(Debug)]
pub enum PeerEvent {
    /// An event of the protocol core (timer, message, fetch result, snapshot).
    Core(Event),
    /// A member of the run connected.
    RunPeerJoined,
    /// The trainer took an inner step.
    Stepped,
    /// The trainer reached its target: merge on until the swarm is quiet, then finish.
    Trained,
    /// Finish now (the user asked to stop).
    Stop,
}

/// What the executor carries out.
#[derive(Debug)]
pub enum Effect {
    /// An output of the protocol core.
    Core(Output),
    /// Serve `payload` under `hash` to peers that fetch it, from now on (before the
    /// announcement that names it); `pinned`: keep it until withdrawn.
    Offer { hash: ContentHash, payload: Bytes, pinned: bool },
    /// No longer offered: a store of the executor's own may let it go.
    Withdraw { hash: ContentHash },
    /// A held late joiner may take its first inner step.
    Release(Release),
    /// Training is over: apply these final anchors (none if training never finished),
    /// then evaluate, checkpoint and stop the trainer. Comes once.
    Finish { anchors: Vec<ApplyAnchor> },
}

/// Why a held joiner was released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// Every fragment holds a state near the round the clock says the swarm is in.
    pub caught_up: bool,
    /// Some peer announced a state at all (else this is a new swarm, nothing to wait for).
    pub heard_any: bool,
    /// The round of each fragment's state at release.
    pub rounds: Vec<u64>,
}

/// The protocol core and the decisions around it (see the module docs).
#[derive(Debug)]
pub struct Peer {
    proto: Protocol,
    period: Millis,
    /// Until when a late joiner waits for the swarm's anchors before its first step;
    /// `None` once it trains (or if it never waited).
    holding: Option<Millis>,
    trained: bool,
    finishing: bool,
    /// Last time a fragment state changed or training advanced.
    last_change: Millis,
    /// When to announce our states again for members that joined, and once more after.
    reannounce: [Option<Millis>; 2],
    offered: Offered,
}

impl Peer {
    /// A peer around `proto` whose rounds last `period`. `late` is the time a fresh peer
    /// started in a swarm that has merged already: it is held until it caught up, or for
    /// two periods and a margin at most.
    ///
    /// Its executor answers every [`Output::Weigh`] (the peer answers those that come
    /// while it finishes): a state nothing here can recompute is adopted only if the
    /// trainer finds it no worse than its own ([`Protocol::set_weighing`]).
    pub fn new(mut proto: Protocol, period: Millis, late: Option<Millis>) -> Self {
        proto.set_weighing(true);
        // A delta is merged within `max_lateness` rounds of its own and a peer makes at
        // most one per fragment round: the last `fragments × (max_lateness + 2)` are kept.
        let raw = proto.settings().raw();
        let keep_own = raw.fragments.saturating_mul(raw.max_lateness as usize + 2);
        let offered = Offered::new(raw.fragments, keep_own);
        Self {
            proto,
            period,
            holding: late.map(|t| {
                t.saturating_add(period.saturating_mul(2)).saturating_add(QUIET_MARGIN_MS)
            }),
            trained: false,
            finishing: false,
            last_change: 0,
            reannounce: [None; 2],
            offered,
        }
    }

    pub fn protocol(&self) -> &Protocol {
        &self.proto
    }

    #[cfg(test)]
    pub(crate) fn protocol_mut(&mut self) -> &mut Protocol {
        &mut self.proto
    }

    /// The payload with this hash, if this peer offers it: its current state of a
    /// fragment or one of its latest own deltas (the node mirrors these into atoll-net's
    /// store, shared, not copied).
    pub fn payload(&self, hash: &ContentHash) -> Option<Bytes> {
        self.offered.get(hash)
    }

    /// Whether a late joiner is still waiting for the swarm's anchors.
    pub fn holding(&self) -> bool {
        self.holding.is_some()
    }

    pub fn finishing(&self) -> bool {
        self.finishing
    }

    /// Starts the core (see [`Protocol::start`]).
    pub fn start(&mut self, now: Millis) -> Vec<Effect> {
        let outs = self.proto.start(now);
        self.after_core(outs, now)
    }

    pub fn handle(&mut self, ev: PeerEvent, now: Millis) -> Vec<Effect> {
        match ev {
            PeerEvent::Core(ev) => {
                let outs = self.proto.handle(ev, now);
                let mut effects = self.after_core(outs, now);
                // A joiner starts training the moment it holds the swarm's anchors.
                effects.extend(self.release_if_caught_up(now));
                effects
            }
            PeerEvent::RunPeerJoined => {
                // A newcomer learns where the swarm is from state announcements; ours come
                // once per period, so say it again (once its subscription has reached us).
                let [soon, late] = &mut self.reannounce;
                soon.get_or_insert(now.saturating_add(REANNOUNCE_SOON_MS));
                late.get_or_insert(now.saturating_add(REANNOUNCE_LATE_MS));
                Vec::new()
            }
            PeerEvent::Stepped => {
                self.last_change = now;
                Vec::new()
            }
            PeerEvent::Trained => {
                self.trained = true;
                self.last_change = now;
                Vec::new()
            }
            PeerEvent::Stop => self.finish(),
        }
    }

    /// The decisions the clock makes: release a held joiner whose wait is over, announce
    /// states again for members that joined, finish a trained peer once the swarm is quiet.
    pub fn poll(&mut self, now: Millis) -> Vec<Effect> {
        let mut effects = self.release_if_caught_up(now);
        if self.reannounce[0].is_some_and(|at| at <= now) {
            self.reannounce = [self.reannounce[1].take(), None];
            let outs = self.proto.reannounce(now);
            effects.extend(self.after_core(outs, now));
        }
        if self.trained && !self.finishing && now.saturating_sub(self.last_change) > self.quiet_ms()
        {
            effects.extend(self.finish());
        }
        effects
    }

    /// The next time [`Peer::poll`] has something to do before the next event (besides
    /// the core's own timers): a re-announcement, the end of a joiner's wait.
    pub fn next_poll(&self) -> Option<Millis> {
        let quiet = (self.trained && !self.finishing)
            .then(|| self.last_change.saturating_add(self.quiet_ms()).saturating_add(1));
        [self.reannounce[0], self.holding, quiet].into_iter().flatten().min()
    }

    /// How long nothing must change before a trained peer finishes.
    pub fn quiet_ms(&self) -> Millis {
        let grace = self.proto.settings().raw().grace_cap_ms;
        self.period.saturating_add(grace).saturating_add(QUIET_MARGIN_MS).max(QUIET_MIN_MS)
    }

    /// Core outputs as effects, with what this peer decides about them: merges, adoptions
    /// and contested rounds (contributions arrived, none agreed) count as change; once
    /// finishing, the trainer gets no anchors, a snapshot is answered at once with the
    /// anchor (nothing was trained since) and a state to weigh goes unweighed.
    fn after_core(&mut self, outs: Vec<Output>, now: Millis) -> Vec<Effect> {
        let mut queue = outs;
        queue.reverse();
        let mut effects = Vec::with_capacity(queue.len());
        while let Some(out) = queue.pop() {
            match &out {
                Output::Publish { msg: Message::State(s), payload } => {
                    effects.extend(self.offered.set_state(s.fragment as usize, s.hash, payload));
                }
                Output::Publish { msg: Message::Contribution(c), payload }
                    if c.origin == self.proto.me() =>
                {
                    effects.extend(self.offered.add_own(c.hash, payload));
                }
                _ => {}
            }
            // The deltas of a merged or adopted state that this peer holds are offered: a
            // peer checking that state fetches the ones it lacks from its holders.
            let made = match &out {
                Output::Merged(r) => Some((r.fragment, r.merged.clone())),
                Output::Adopted { fragment, .. } => {
                    Some((*fragment, self.proto.last_merge(*fragment)))
                }
                _ => None,
            };
            if let Some((p, merged)) = made {
                let deltas =
                    merged.iter().filter_map(|h| Some((*h, self.proto.held_payload(p, h)?)));
                effects.extend(self.offered.set_merged(p, deltas.collect()));
            }
            match out {
                Output::Merged(_)
                | Output::Adopted { .. }
                | Output::Skipped { contested: true, .. } => self.last_change = now,
                Output::Apply(_) if self.finishing => continue,
                Output::Snapshot { fragment, round } if self.finishing => {
                    let params = self.proto.state(fragment).anchor.clone();
                    let ev = Event::Snapshot { fragment, round, params, tokens: 0, steps: 0 };
                    let mut more = self.proto.handle(ev, now);
                    more.reverse();
                    queue.extend(more);
                    continue;
                }
                // Nor is a state weighed: the trainer is done, and what is adopted now
                // reaches no model (its anchors are not applied).
                Output::Weigh { fragment, hash, .. } if self.finishing => {
                    let ev = Event::Weighed { fragment, hash, losses: None };
                    let mut more = self.proto.handle(ev, now);
                    more.reverse();
                    queue.extend(more);
                    continue;
                }
                _ => {}
            }
            effects.push(Effect::Core(out));
        }
        // A state merged or adopted without an announcement (a sampled swarm announces only
        // its contributors' merges) is still offered: this peer's deltas name it as base.
        // (Round 0's state is the manifest's, which every peer makes for itself.)
        for p in 0..self.proto.settings().raw().fragments {
            if self.proto.state(p).round == 0 {
                continue;
            }
            let hash = self.proto.state_hash(p);
            effects.extend(self.offered.set_state(p, hash, self.proto.state_payload(p)));
        }
        effects
    }

    /// Releases a held joiner once every fragment caught up with the swarm, or when its
    /// wait is over (nobody answered: the run's initial anchors it is).
    fn release_if_caught_up(&mut self, now: Millis) -> Vec<Effect> {
        let Some(until) = self.holding else { return Vec::new() };
        let p = self.proto.settings().raw().fragments;
        // Caught up with what we heard, and near the round the clock says the swarm is in:
        // a delta announcement heard before any state names an old base round, and must not
        // release a joiner that holds nothing yet.
        let near_clock = |i: usize| {
            let state = self.proto.state(i).round;
            state.saturating_add(MAX_ROUNDS_BEHIND_CLOCK)
                >= self.proto.schedule().current_round(i, now)
        };
        let caught_up = (0..p).all(|i| self.proto.caught_up(i) && near_clock(i));
        if !caught_up && now < until {
            return Vec::new();
        }
        self.holding = None;
        let rounds = (0..p).map(|i| self.proto.state(i).round).collect();
        let heard_any = (0..p).any(|i| self.proto.heard_round(i) > 0);
        vec![Effect::Release(Release { caught_up, heard_any, rounds })]
    }

    /// Final anchors (if trained) and the end of training; once.
    fn finish(&mut self) -> Vec<Effect> {
        if self.finishing {
            return Vec::new();
        }
        self.finishing = true;
        self.holding = None;
        let anchors = if self.trained {
            (0..self.proto.settings().raw().fragments)
                .map(|p| {
                    let s = self.proto.state(p);
                    ApplyAnchor {
                        fragment: p,
                        round: s.round,
                        anchor: s.anchor.clone(),
                        alpha: 0.0,
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        vec![Effect::Finish { anchors }]
    }
}

#[cfg(test)]
mod tests;
