//! One fragment's runtime: its replicated state, the contributions it holds, the open round
//! and the votes. Everything here is per fragment, so fragments never wait on each other.

use super::fasthash::FastMap;
use super::io::{ApplyAnchor, Contribution, MergeReport, Metrics, Output};
use super::merge::{self, Input};
use super::reconcile::Votes;
use super::state::FragmentState;
use super::{Millis, PeerId, Settings};
use crate::delta::{self, ContentHash, ErrorFeedback, Limits, NormGuard};
use crate::fragment::FragmentSpec;
use std::sync::Arc;

/// A contribution this peer holds: pending, or merged recently (kept so that it can be
/// served, and re-queued if an adopted state turns out not to contain it).
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub origin: PeerId,
    pub round: u64,
    pub tokens: u64,
    pub steps: u64,
    /// Decoded values while pending; dropped once merged to save memory.
    pub values: Option<Vec<f32>>,
    pub bytes: Arc<[u8]>,
    /// Round this peer's lineage merged it in.
    pub merged_at: Option<u64>,
}

/// Bookkeeping of the round currently open.
#[derive(Debug, Clone)]
pub(crate) struct OpenRound {
    pub round: u64,
    pub opened_at: Millis,
    pub quorum_at: Option<Millis>,
    pub grace_ms: Millis,
    /// Pending contributions eligible for this round (kept incrementally: O(1) per arrival).
    pub eligible: usize,
    pub closed: bool,
    /// The trainer's snapshot for this round has been asked for and not yet given. The
    /// round cannot close before it arrives: a merge applied first would replace the
    /// parameters the snapshot is meant to measure, and the round's progress would be lost.
    pub awaiting_snapshot: bool,
}

#[derive(Debug)]
pub(crate) struct Lane {
    pub spec: FragmentSpec,
    pub state: FragmentState,
    pub state_hash: ContentHash,
    pub feedback: ErrorFeedback,
    pub guard: NormGuard,
    pub votes: Votes,
    /// By content hash. Walks over it are in map order; the merge sorts its inputs and
    /// re-announcements are sorted, so no result depends on that order.
    pub held: FastMap<ContentHash, Held>,
    pub open: Option<OpenRound>,
    /// State payload being fetched (at most one at a time per fragment).
    pub state_fetch: Option<ContentHash>,
    pub last_snapshot_at: Option<Millis>,
    /// The latest round this peer closed (merged, skipped, or covered by an adopted state).
    /// A skipped round does not advance the state's round, so "am I behind?" looks here.
    pub closed_round: u64,
}

/// Which contributions a round merges: those made for rounds `round − lag − lateness ..=
/// round − lag`. With `lag = 1` a round merges the previous round's deltas, which have had a
/// whole period to reach every peer, so peers merge the same set without waiting; with
/// `lag = 0` a round merges its own deltas (fresher, but a set that depends on arrival
/// times, fixed up by reconciliation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub lag: u64,
    pub lateness: u64,
}

impl Window {
    pub fn of(settings: &Settings) -> Self {
        Self { lag: settings.raw().merge_lag, lateness: settings.raw().max_lateness }
    }

    /// Whether a contribution made for `made_for` may be merged in round `round`.
    pub fn eligible(&self, made_for: u64, round: u64) -> bool {
        made_for + self.lag <= round && made_for + self.lag + self.lateness >= round
    }

    /// Whether a contribution made for `made_for` can no longer be merged after `round`.
    pub fn stale(&self, made_for: u64, round: u64) -> bool {
        made_for + self.lag + self.lateness < round
    }

    /// Rounds of merged-id log a state must keep to refuse every duplicate.
    pub fn log_rounds(&self) -> u64 {
        self.lateness + 1
    }
}

impl Lane {
    pub fn new(
        spec: FragmentSpec,
        state: FragmentState,
        settings: &Settings,
        peers: usize,
    ) -> Self {
        let r = settings.raw();
        let numel = spec.numel();
        Self {
            spec,
            state_hash: state.hash(),
            state,
            feedback: ErrorFeedback::new(numel),
            guard: NormGuard::new(r.norm_window, 8.min(r.norm_window), r.norm_factor),
            votes: Votes::new(peers),
            held: FastMap::default(),
            open: None,
            state_fetch: None,
            last_snapshot_at: None,
            closed_round: 0,
        }
    }

    /// Whether `h` should count towards the open round's quorum.
    pub fn counts_now(&self, h: &Held, w: Window) -> bool {
        h.merged_at.is_none()
            && self.open.as_ref().is_some_and(|o| !o.closed && w.eligible(h.round, o.round))
    }

    /// Stores a contribution; returns whether it counts towards the open round.
    pub fn insert(&mut self, hash: ContentHash, h: Held, w: Window) -> bool {
        let counts = self.counts_now(&h, w);
        self.held.insert(hash, h);
        if counts {
            if let Some(o) = self.open.as_mut() {
                o.eligible += 1;
            }
        }
        counts
    }

    /// Opens `round`: counts what is already pending for it.
    pub fn open_round(&mut self, round: u64, now: Millis, w: Window, m: &mut Metrics) {
        // Pruning here too (not only after merges) bounds memory when rounds keep being
        // skipped, e.g. with a quorum that never comes.
        self.prune(round, w, m);
        let eligible = self
            .held
            .values()
            .filter(|h| h.merged_at.is_none() && w.eligible(h.round, round))
            .count();
        self.open = Some(OpenRound {
            round,
            opened_at: now,
            quorum_at: None,
            grace_ms: 0,
            eligible,
            closed: false,
            awaiting_snapshot: false,
        });
    }

    /// Merges the open round's eligible contributions into the state (DESIGN.md §2.3).
    pub fn merge(
        &mut self,
        me: PeerId,
        settings: &Settings,
        now: Millis,
        m: &mut Metrics,
    ) -> Vec<Output> {
        let r = settings.raw();
        let w = Window::of(settings);
        let Some(open) = self.open.as_mut() else { return Vec::new() };
        open.closed = true;
        self.closed_round = self.closed_round.max(open.round);
        let (round, opened_at, quorum_at, grace_ms) =
            (open.round, open.opened_at, open.quorum_at, open.grace_ms);
        let mut inputs: Vec<Input<'_>> = self
            .held
            .iter()
            .filter(|(_, h)| h.merged_at.is_none() && w.eligible(h.round, round))
            .filter_map(|(hash, h)| {
                let values = h.values.as_deref()?;
                Some(Input { hash: *hash, tokens: h.tokens, steps: h.steps, values })
            })
            .collect();
        // The incremental count can overstate what is mergeable (a counted delta may have
        // been found merged by an adopted state since); the set itself decides.
        if inputs.len() < r.quorum {
            m.skipped_rounds += 1;
            return vec![Output::Skipped { fragment: self.spec.id, round }];
        }
        merge::canonical_order(&mut inputs);
        let delta = merge::combine(&self.spec, &inputs, r.merge);
        let merged: Vec<ContentHash> = inputs.iter().map(|i| i.hash).collect();
        merge::outer_step(
            &mut self.state.anchor,
            &mut self.state.momentum,
            &delta,
            r.outer_lr,
            r.momentum,
        );
        self.state.round = round;
        let shorts = merged.iter().map(ContentHash::short).collect();
        self.state.record(round, shorts, w.log_rounds());
        let mut late = 0;
        let mut contributions = Vec::with_capacity(merged.len());
        for hash in &merged {
            if let Some(h) = self.held.get_mut(hash) {
                contributions.push(Contribution { origin: h.origin, tokens: h.tokens });
                late += usize::from(h.round + w.lag < round);
                h.merged_at = Some(round);
                h.values = None;
            }
        }
        self.state_hash = self.state.hash();
        self.votes.record(me, round, self.state_hash);
        self.prune(round, w, m);
        m.merges += 1;
        m.merged_contributions += merged.len() as u64;
        m.late_merged += late as u64;
        let report = MergeReport {
            fragment: self.spec.id,
            round,
            state_hash: self.state_hash,
            merged,
            contributions,
            late,
            since_open_ms: now.saturating_sub(opened_at),
            waited_ms: quorum_at.map_or(0, |q| now.saturating_sub(q)),
            grace_ms,
        };
        self.after_state_change(settings, Output::Merged(report))
    }

    /// Outputs shared by merge and adoption: the anchor for the trainer, the state
    /// announcement, and the report.
    fn after_state_change(&self, settings: &Settings, report: Output) -> Vec<Output> {
        let apply = ApplyAnchor {
            fragment: self.spec.id,
            round: self.state.round,
            anchor: self.state.anchor.clone(),
            alpha: settings.raw().alpha,
        };
        let announce = super::Message::State(super::StateAnnounce {
            fragment: self.spec.id as u32,
            round: self.state.round,
            hash: self.state_hash,
            size: self.state.wire_len() as u64,
        });
        vec![Output::Apply(apply), Output::Broadcast(announce), report]
    }

    /// Drops contributions too old to merge; unmerged ones are counted as stale.
    fn prune(&mut self, round: u64, w: Window, m: &mut Metrics) {
        self.held.retain(|_, h| {
            let keep = !w.stale(h.round, round);
            if !keep && h.merged_at.is_none() {
                m.stale_dropped += 1;
            }
            keep
        });
        self.votes.prune(round.saturating_sub(w.log_rounds()));
    }

    /// Marks held deltas that `new` already merged as merged, and re-queues those this peer
    /// had merged but `new` had not; returns the re-queued ones in hash order.
    fn requeue(&mut self, new: &FragmentState, limits: &Limits) -> Vec<ContentHash> {
        let mut resurrected = Vec::new();
        for (h, held) in self.held.iter_mut() {
            if new.has_merged(h.short()) {
                held.merged_at = Some(new.round);
                held.values = None;
            } else if held.merged_at.is_some() {
                // Re-decode: these bytes passed every check when they first arrived.
                if let Ok(d) = delta::decode(&held.bytes, &self.spec, limits) {
                    held.values = Some(d.values);
                    held.merged_at = None;
                    resurrected.push(*h);
                }
            }
        }
        resurrected.sort_unstable();
        resurrected
    }

    /// Replaces the state by `new` (the majority's). Contributions the new lineage already
    /// merged are marked merged; those this peer had merged but the new lineage had not are
    /// re-queued and re-announced, so they are merged once in the new lineage, not lost.
    pub fn adopt(
        &mut self,
        me: PeerId,
        new: FragmentState,
        hash: ContentHash,
        settings: &Settings,
        limits: &Limits,
        m: &mut Metrics,
    ) -> Vec<Output> {
        let previous_round = self.state.round;
        let new_round = new.round;
        let w = Window::of(settings);
        let resurrected = self.requeue(&new, limits);
        m.adoptions += 1;
        m.resurrected += resurrected.len() as u64;
        // Only the origin re-announces: every peer of a minority re-announcing every
        // re-queued delta would flood the swarm, and the origin holds its own deltas.
        let mut out = Vec::new();
        for h in resurrected {
            if let Some(held) = self.held.get(&h).filter(|held| held.origin == me) {
                out.push(Output::Broadcast(super::Message::Contribution(
                    super::ContributionAnnounce {
                        fragment: self.spec.id as u32,
                        round: held.round,
                        hash: h,
                        size: held.bytes.len() as u64,
                        tokens: held.tokens,
                        steps: held.steps,
                        origin: held.origin,
                        base: hash,
                        base_round: new_round,
                    },
                )));
            }
        }
        self.state = new;
        self.state_hash = hash;
        self.votes.record(me, self.state.round, hash);
        self.closed_round = self.closed_round.max(new_round);
        if let Some(o) = self.open.as_mut() {
            // The adopted state already contains this round's merge: do not merge it again.
            o.closed |= o.round <= new_round;
            let round = o.round;
            o.eligible = self
                .held
                .values()
                .filter(|h| h.merged_at.is_none() && w.eligible(h.round, round))
                .count();
        }
        let report = Output::Adopted {
            fragment: self.spec.id,
            round: self.state.round,
            hash,
            previous_round,
        };
        out.extend(self.after_state_change(settings, report));
        out
    }
}
