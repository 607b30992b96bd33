//! The protocol state machine: dispatches events to fragments and tracks fetches.

use super::fasthash::{FastMap, FastSet};
use super::fetch::InFlight;
use super::held::Held;
use super::io::{Event, Metrics, Offence, Output, Timer};
use super::lane::Lane;
use super::schedule::{Grace, Millis, Schedule, Window};
use super::state::FragmentState;
use super::{ContributionAnnounce, Message, PeerId, Settings};
use crate::delta::{self, ContentHash, DeltaMeta, ErrorFeedback, Limits};
use crate::fragment::FragmentPlan;

mod view;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Most fetches in flight at once; announcements beyond it are ignored (and counted). Each
/// author may have one delta per fragment round in flight, so honest swarms of a few
/// thousand peers stay below it; fake identities hit it, not memory.
pub const MAX_IN_FLIGHT: usize = 1 << 13;
/// Most peers whose votes are remembered per fragment.
pub const MAX_PEERS: usize = 1 << 16;

/// Why the core could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    #[error("the plan has {plan} fragments but the settings say {settings}")]
    FragmentCount { plan: usize, settings: usize },
    #[error("state of fragment {fragment} has {got} values, the plan says {want}")]
    StateLength { fragment: usize, got: usize, want: usize },
}

/// One peer's protocol core. See the module docs of [`super`] for the flow.
#[derive(Debug)]
pub struct Protocol {
    pub(super) me: PeerId,
    pub(super) settings: Settings,
    pub(super) schedule: Schedule,
    pub(super) grace: Grace,
    pub(super) limits: Limits,
    pub(super) lanes: Vec<Lane>,
    pub(super) in_flight: FastMap<ContentHash, InFlight>,
    /// Announced sizes of the deltas in flight (they count against `max_held_bytes`).
    pub(super) in_flight_bytes: u64,
    pub(super) rejected: FastSet<ContentHash>,
    /// Payloads (states and deltas) whose fetch failed from every holder, and until when
    /// not to chase them again (their only holders are stalled, gone or never served them;
    /// chasing a state would keep the fragment from contributing, round after round, and a
    /// delta re-announced but never served would hold a fetch each time).
    pub(super) unreachable: FastMap<ContentHash, Millis>,
    pub(super) rng: ChaCha8Rng,
    pub(super) metrics: Metrics,
    /// When the armed fetch-sweep timer fires, if one is armed.
    pub(super) sweep_at: Option<Millis>,
    /// The executor answers [`Output::Weigh`]: a state nothing here can recompute is
    /// weighed on the trainer's validation data before it is adopted.
    pub(super) weighs: bool,
}

impl Protocol {
    /// A fresh peer whose anchors are `initial[p]` (the run's initial parameters, the same
    /// on every peer) at round 0. `seed` drives its only randomness (choice of sources).
    pub fn new(
        me: PeerId,
        settings: Settings,
        plan: &FragmentPlan,
        initial: Vec<Vec<f32>>,
        seed: u64,
    ) -> Result<Self, ProtoError> {
        let sampling = super::sampling::Sampling::initial(settings.raw());
        let states = initial
            .into_iter()
            .enumerate()
            .map(|(p, a)| {
                let mut s = FragmentState::initial(p as u32, a);
                s.sampling = sampling;
                s
            })
            .collect();
        Self::restore(me, settings, plan, states, seed)
    }

    /// Continues a saved error-feedback residual of fragment `p`; `false` (and nothing
    /// changes) when there is no such fragment or the residual does not fit it.
    pub fn restore_residual(&mut self, p: usize, residual: Vec<f32>) -> bool {
        let Some(lane) = self.lanes.get_mut(p) else { return false };
        match ErrorFeedback::from_residual(residual, lane.state.anchor.len()) {
            Some(fb) => {
                lane.feedback = fb;
                true
            }
            None => false,
        }
    }

    /// A peer resuming from saved fragment states (e.g. a checkpoint).
    pub fn restore(
        me: PeerId,
        settings: Settings,
        plan: &FragmentPlan,
        states: Vec<FragmentState>,
        seed: u64,
    ) -> Result<Self, ProtoError> {
        let p = settings.raw().fragments;
        if plan.len() != p || states.len() != p {
            return Err(ProtoError::FragmentCount { plan: plan.len(), settings: p });
        }
        let mut lanes = Vec::with_capacity(p);
        for (spec, state) in plan.fragments.iter().zip(states) {
            let want = spec.numel();
            if state.anchor.len() != want || state.momentum.len() != want {
                let got = state.anchor.len();
                return Err(ProtoError::StateLength { fragment: spec.id, got, want });
            }
            lanes.push(Lane::new(me, spec.clone(), state, MAX_PEERS));
        }
        Ok(Self {
            me,
            schedule: Schedule::new(&settings),
            grace: Grace::new(&settings),
            limits: Limits { max_payload_bytes: settings.raw().max_payload_bytes },
            settings,
            lanes,
            in_flight: FastMap::default(),
            in_flight_bytes: 0,
            rejected: FastSet::default(),
            unreachable: FastMap::default(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            metrics: Metrics::default(),
            sweep_at: None,
            weighs: false,
        })
    }

    /// Says whether the executor answers [`Output::Weigh`] with [`Event::Weighed`] (a
    /// node with a trainer, the simulator). When it does, a fetched state that nothing
    /// here can recompute is adopted only if it is no worse than this peer's own on the
    /// trainer's validation data ([`super::weigh::WORSE_MARGIN`]); votes alone decide
    /// otherwise.
    pub fn set_weighing(&mut self, on: bool) {
        self.weighs = on;
    }

    /// Arms the first round timer of every fragment. Call once, at start.
    pub fn start(&mut self, now: Millis) -> Vec<Output> {
        (0..self.lanes.len())
            .map(|p| {
                let round = self.schedule.next_round(p, now);
                let at = self.schedule.open_time(p, round);
                Output::SetTimer { at, timer: Timer::Open { fragment: p, round } }
            })
            .collect()
    }

    /// Feeds one event at time `now` and returns what to do.
    pub fn handle(&mut self, event: Event, now: Millis) -> Vec<Output> {
        let mut out = Vec::new();
        match event {
            Event::Timer(t) => self.on_timer(t, now, &mut out),
            Event::Snapshot { fragment, round, params, tokens, steps } => {
                self.on_snapshot(fragment, round, &params, tokens, steps, now, &mut out)
            }
            Event::Message { from, msg } => self.on_message(from, msg, now, &mut out),
            Event::Fetched { from, hash, bytes } => {
                self.on_fetched(from, hash, bytes, now, &mut out)
            }
            Event::FetchFailed { from, hash, denied, silent } => {
                self.on_fetch_failed(from, hash, &denied, &silent, now, &mut out)
            }
            Event::Weighed { fragment, hash, losses } => {
                self.on_weighed(fragment, hash, losses, now, &mut out)
            }
        }
        out
    }

    /// Announcements worth repeating when a peer joins: this peer's states (past round 0)
    /// and its own contributions that can still be merged. The newcomer learns where the
    /// swarm is, and by fetching the contributions it credits their authors, whose state
    /// votes then count (see [`super::reconcile`]).
    pub(crate) fn reannounce(&mut self, now: Millis) -> Vec<Output> {
        let w = Window::of(&self.settings);
        let mut out = Vec::new();
        for (p, lane) in self.lanes.iter_mut().enumerate() {
            let current = self.schedule.current_round(p, now);
            let mut own: Vec<(&ContentHash, &Held)> = lane
                .held
                .iter()
                .filter(|(_, h)| h.origin == self.me && !w.stale(h.round, current))
                .collect();
            own.sort_unstable_by_key(|(hash, _)| **hash);
            for (hash, h) in own {
                let msg = Message::Contribution(ContributionAnnounce {
                    fragment: p as u32,
                    round: h.round,
                    hash: *hash,
                    size: h.bytes.len() as u64,
                    tokens: h.tokens,
                    steps: h.steps,
                    origin: self.me,
                    base: lane.state_hash,
                    base_round: lane.state.round,
                });
                out.push(Output::Publish { msg, payload: h.bytes.clone() });
            }
            if lane.state.round > 0 {
                out.push(lane.announcement());
            }
        }
        out
    }

    fn on_timer(&mut self, t: Timer, now: Millis, out: &mut Vec<Output>) {
        match t {
            Timer::Open { fragment, round } => self.on_open(fragment, round, now, out),
            Timer::Close { fragment, round } => {
                let lane = &mut self.lanes[fragment];
                if lane.open.as_ref().is_some_and(|o| o.round == round && !o.closed) {
                    let (outs, dropped) =
                        lane.merge(self.me, &self.settings, &self.limits, now, &mut self.metrics);
                    out.extend(outs);
                    dropped.into_iter().for_each(|h| self.note_rejected(h));
                }
            }
            Timer::Deadline { fragment, round } => self.on_deadline(fragment, round, now, out),
            Timer::Reconcile { fragment, .. } => self.reconcile(fragment, now, out),
            Timer::FetchSweep => self.sweep(now, out),
        }
    }

    fn on_open(&mut self, p: usize, round: u64, now: Millis, out: &mut Vec<Output>) {
        let lane = &mut self.lanes[p];
        if lane.open.as_ref().is_some_and(|o| o.round >= round) {
            return;
        }
        let quorum = self.settings.raw().quorum;
        lane.open_round(round, now, Window::of(&self.settings), quorum, &mut self.metrics);
        let opened = self.schedule.open_time(p, round).max(now);
        // A peer that is behind does not publish a delta against its stale anchor; its
        // tokens keep counting into the next snapshot, after it has caught up.
        if self.behind(p) {
            self.reconcile(p, now, out);
        } else if self.lanes[p].state_fetch.is_none() {
            if let Some(o) = self.lanes[p].open.as_mut() {
                o.awaiting_snapshot = true;
            }
            out.push(Output::Snapshot { fragment: p, round });
        }
        // The round waits for our own snapshot, which comes at the end of the trainer's
        // current step: a slow peer gets one of its own steps on top of `max_wait_ms`.
        let wait = self.settings.max_wait_ms() + self.grace.t_step.get().ceil() as Millis;
        out.push(Output::SetTimer {
            at: opened.saturating_add(wait),
            timer: Timer::Deadline { fragment: p, round },
        });
        // Reconciliation looks twice a round: at `reconcile_at`, and halfway from there to
        // the next open. A peer whose own count put its state ahead at the first look (its
        // own vote, and its own credit of itself, which the others need not share) may find
        // that the others all took another state; their adoptions are announced after the
        // first look, and a vote of a round already reconciled is acted on only when it
        // shows the peer behind. Without the second look it would hold its state apart for
        // a whole period, and to the end of a run in its last round.
        let first = self.settings.reconcile_offset_ms();
        let second = first + self.settings.period_ms().saturating_sub(first) / 2;
        for offset in [first, second] {
            out.push(Output::SetTimer {
                at: self.schedule.open_time(p, round).saturating_add(offset),
                timer: Timer::Reconcile { fragment: p, round },
            });
        }
        let next = round.saturating_add(1);
        out.push(Output::SetTimer {
            at: self.schedule.open_time(p, next),
            timer: Timer::Open { fragment: p, round: next },
        });
        self.check_quorum(p, now, out);
    }

    /// The quorum did not come: skip the round. If others did merge it, this peer lacked
    /// their inputs (typically just after catching up), so it reconciles now rather than
    /// half a period later.
    fn on_deadline(&mut self, p: usize, round: u64, now: Millis, out: &mut Vec<Output>) {
        let lane = &mut self.lanes[p];
        let Some(o) = lane.open.as_mut() else { return };
        if o.round != round || o.closed || o.quorum_at.is_some() {
            return;
        }
        o.closed = true;
        lane.closed_round = lane.closed_round.max(round);
        self.metrics.skipped_rounds += 1;
        out.push(Output::Skipped { fragment: p, round, contested: false });
        if lane.votes.max_round() >= round {
            self.reconcile(p, now, out);
        }
    }

    /// Starts the grace window once the quorum is held: the adaptive window if the set is
    /// wide ([`OpenRound::wide_at`](super::lane::OpenRound)), else the whole cap, cut to
    /// the adaptive window from the moment the set becomes wide.
    pub(super) fn check_quorum(&mut self, p: usize, now: Millis, out: &mut Vec<Output>) {
        let k = self.settings.raw().quorum;
        let Some(o) = self.lanes[p].open.as_mut() else { return };
        if o.closed || o.awaiting_snapshot || o.eligible < k {
            return;
        }
        // At lag 1 the set is the previous round's, complete: any contribution counts.
        let width = if self.settings.raw().merge_lag == 0 { o.vouched } else { o.eligible };
        let wide = width >= o.wide_at;
        let close = match o.quorum_at {
            None => {
                o.quorum_at = Some(now);
                self.grace.t_quorum.update(now.saturating_sub(o.opened_at) as f64);
                o.narrow = !wide;
                o.grace_ms = if wide { self.grace.window() } else { self.grace.whole() };
                now.saturating_add(o.grace_ms)
            }
            Some(at) if o.narrow && wide => {
                o.narrow = false;
                let close = now.saturating_add(self.grace.window());
                if close >= at.saturating_add(o.grace_ms) {
                    return;
                }
                o.grace_ms = close - at;
                close
            }
            Some(_) => return,
        };
        out.push(Output::SetTimer {
            at: close,
            timer: Timer::Close { fragment: p, round: o.round },
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn on_snapshot(
        &mut self,
        p: usize,
        round: u64,
        params: &[f32],
        tokens: u64,
        steps: u64,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let Some(lane) = self.lanes.get_mut(p) else { return };
        if let Some(o) = lane.open.as_mut().filter(|o| o.round == round) {
            o.awaiting_snapshot = false;
        }
        if steps == 0 || params.len() != lane.state.anchor.len() {
            return self.check_quorum(p, now, out);
        }
        if let Some(prev) = lane.last_snapshot_at {
            self.grace.t_step.update(now.saturating_sub(prev) as f64 / steps as f64);
        }
        lane.last_snapshot_at = Some(now);
        let d: Vec<f32> = lane.state.anchor.iter().zip(params).map(|(a, t)| a - t).collect();
        if !lane.state.sampling.publishes(self.me, p, round) {
            // Not this peer's slot (`super::sampling`): just before it, the work waits in the
            // residual and the counters and goes out whole in the slot; earlier work would
            // arrive too late to help and is not sent. A diverged delta is not kept, as it
            // would not be published.
            if !lane.state.sampling.banks(self.me, p, round) {
                self.metrics.unsent += 1;
            } else if d.iter().all(|v| v.is_finite()) && lane.feedback.absorb(&d) {
                lane.banked.0 = lane.banked.0.saturating_add(tokens);
                lane.banked.1 = lane.banked.1.saturating_add(steps);
                self.metrics.banked += 1;
                out.push(Output::Banked { fragment: p, round });
            }
            return self.check_quorum(p, now, out);
        }
        let (tokens, steps) =
            (tokens.saturating_add(lane.banked.0), steps.saturating_add(lane.banked.1));
        let meta = DeltaMeta { author: self.me.0, fragment: p as u32, round, tokens, steps };
        let opts = self.settings.raw().encode;
        // A local delta that cannot be encoded (non-finite: the trainer diverged) is not
        // published; the residual is left as it was.
        let Ok(enc) = delta::encode(meta, &d, Some(&mut lane.feedback), &opts) else { return };
        lane.banked = (0, 0);
        self.metrics.published += 1;
        self.metrics.published_bytes += enc.bytes.len() as u64;
        let announce = ContributionAnnounce {
            fragment: p as u32,
            round,
            hash: enc.hash,
            size: enc.bytes.len() as u64,
            tokens,
            steps,
            origin: self.me,
            base: lane.state_hash,
            base_round: lane.state.round,
        };
        // The base is a vote too (`super::intake`).
        lane.announced_round = lane.announced_round.max(lane.state.round);
        let payload = enc.bytes.clone();
        let held =
            Held { origin: self.me, round, tokens, steps, bytes: enc.bytes, merged_at: None };
        lane.insert(enc.hash, held, Window::of(&self.settings));
        out.push(Output::Publish { msg: Message::Contribution(announce), payload });
        self.check_quorum(p, now, out);
    }
}

pub(super) fn misbehaved(out: &mut Vec<Output>, peer: PeerId, offence: Offence, detail: String) {
    out.push(Output::Misbehaved { peer, offence, detail });
}
