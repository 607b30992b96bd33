//! One fragment's runtime: its replicated state, the contributions it holds, the open round
//! and the votes. Everything here is per fragment, so fragments never wait on each other.

use super::fasthash::{FastMap, FastSet};
use super::held::{self, merge_inputs, Held};
use super::io::{ApplyAnchor, Contribution, MergeReport, Metrics, Output};
use super::merge;
use super::reconcile::Votes;
use super::schedule::Window;
use super::state::FragmentState;
use super::{Millis, PeerId, Settings};
use crate::delta::{ContentHash, ErrorFeedback, Limits};
use crate::fragment::FragmentSpec;
use bytes::Bytes;
use std::sync::OnceLock;

mod adopt;

/// Bookkeeping of the round currently open.
#[derive(Debug, Clone)]
pub(crate) struct OpenRound {
    pub round: u64,
    pub opened_at: Millis,
    pub quorum_at: Option<Millis>,
    pub grace_ms: Millis,
    /// How many eligible contributions make the set wide enough to close after the
    /// adaptive grace window; a narrower one waits the whole cap for more. With merge lag 0
    /// a set is whatever arrived first, and a colluding minority can always arrive first:
    /// its copies would be most of an early small set, and with it the median and all the
    /// weight. So the set waits for half the contributions a round brings — the peers this
    /// one saw contribute lately and itself ([`Votes::credited`]) — or the cap. In a
    /// sampled swarm a round brings the deltas of the credited peers whose slot it is,
    /// a handful, which this peer can name: the set waits for all of them (or the cap),
    /// since with half of them each peer closed on its own subset and over a quarter of
    /// the merges of 16 simulated peers ended in an adoption (27% → 15%, `tests/simulator/
    /// sampling.rs`). A fragment's first merge always waits the
    /// cap (`usize::MAX`): nobody has earned credit yet, and no momentum holds a small
    /// set's direction in check. With lag 1 the set is the previous round's, complete: the
    /// quorum is enough. At lag 0 the count is [`OpenRound::vouched`].
    pub wide_at: usize,
    /// The window in force is the whole cap, waiting for a wide set.
    pub narrow: bool,
    /// Pending contributions eligible for this round (kept incrementally: O(1) per arrival).
    pub eligible: usize,
    /// Of those, the ones by peers whose votes count and by this one ([`Votes::vouches`]):
    /// what makes a lag-0 set wide. A contributor without credit — a newcomer, or colluders
    /// whose work never had weight — is merged if it arrives in time but cannot close the
    /// round sooner: at lag 0 four refused colluders of 16 arriving early closed sets on
    /// half the honest deltas.
    pub vouched: usize,
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
    /// The wire form of `state` (what `state_hash` hashes), made once per merge or taken as
    /// fetched at adoption: announcing, re-announcing and serving the state then copy
    /// nothing (shared with the payload store while it keeps it). Made when first asked
    /// for (`Lane::state_bytes`) for a state this peer starts from: nobody fetches the
    /// run's initial states, and a joiner's 87 MB of them (10M parameters) are replaced by
    /// the swarm's before it is asked for any.
    state_bytes: OnceLock<Bytes>,
    pub feedback: ErrorFeedback,
    /// Tokens and inner steps trained outside this peer's slots since its last published
    /// delta (their work is in `feedback`); the next delta claims them.
    pub banked: (u64, u64),
    pub votes: Votes,
    /// By content hash. Walks over it are in map order; the merge sorts its inputs and
    /// re-announcements are sorted, so no result depends on that order.
    pub held: FastMap<ContentHash, Held>,
    /// Bytes of the payloads in `held`.
    pub held_bytes: u64,
    /// The delta each author announced for a round (first one wins): one contribution per
    /// author per fragment round, and a second, different one is equivocation.
    pub claims: FastMap<(PeerId, u64), ContentHash>,
    /// Authors that announced two different deltas for a round: none of theirs for that
    /// round is merged (bounded like `claims`, pruned with it).
    pub equivocators: FastSet<(PeerId, u64)>,
    pub open: Option<OpenRound>,
    /// State payload being fetched (at most one at a time per fragment).
    pub state_fetch: Option<ContentHash>,
    pub last_snapshot_at: Option<Millis>,
    /// The latest round this peer closed (merged, skipped, or covered by an adopted state).
    /// A skipped round does not advance the state's round, so "am I behind?" looks here.
    pub closed_round: u64,
    /// The state held before the latest merge or adoption, with its hash: the parent a
    /// competing state of the same round names, checked against (src/proto/evidence.rs).
    pub prior: Option<(ContentHash, FragmentState)>,
    /// The state before `prior`: the grandparent of a competing state whose parent this
    /// peer never held (it merged the round before with another set, then merged again on
    /// top before reconciling), from which that parent is recomputed first.
    pub prior_before: Option<(ContentHash, FragmentState)>,
    /// A state fetched for adoption that arrived after this peer had merged a later round
    /// on its own lineage, with its hash: too old to adopt, but the parent the swarm's
    /// next state names, so that state is recomputed from its recipe instead of fetched
    /// too late again (src/proto/evidence.rs). Dropped at the next adoption.
    pub overtaken: Option<(ContentHash, FragmentState)>,
    /// The swarm's state whose recipe lacks only deltas still in flight here: the
    /// reconciliation waits for them (src/proto/catchup.rs) instead of fetching the state.
    pub recipe_wait: Option<ContentHash>,
    /// The last state whose recipes were given up on and fetched: a later fetch of it (the
    /// first one failed) is a retry, not a state without a recipe.
    pub recipes_given_up: Option<ContentHash>,
    /// The latest recipe each credited voter announced, with its state's hash and round.
    pub recipes: FastMap<PeerId, (ContentHash, u64, super::Recipe)>,
    /// Each of those voters' recipe before its latest (of an earlier round): the recipe of
    /// the parent of the state it now holds.
    pub recipes_before: FastMap<PeerId, (ContentHash, u64, super::Recipe)>,
    /// Deltas a fetched state lists that this peer lacked, fetched to check that state
    /// (src/proto/check.rs): read by recomputation only, never merged; emptied when the
    /// check ends.
    pub listed: FastMap<ContentHash, Held>,
    /// The fetched state waiting for them.
    pub check: Option<super::check::Check>,
    /// The last state checked that way: a state is checked once.
    pub checked: Option<ContentHash>,
    /// The fetched state the trainer is weighing before it is adopted (`Output::Weigh`);
    /// `state_fetch` names it meanwhile, so it is not fetched again.
    pub weighing: Option<super::weigh::Weighing>,
    /// The latest round of a vote this peer published for the fragment (a state
    /// announcement, or a contribution's base): others count that vote until a later one
    /// replaces it, so an adoption of a state of that round or an earlier one must be
    /// announced. A restored state's round counts as announced (it may have been before
    /// the restart).
    pub announced_round: u64,
}

impl Lane {
    /// The wire form of `state`.
    pub fn state_bytes(&self) -> &Bytes {
        self.state_bytes.get_or_init(|| self.state.to_bytes().into())
    }

    pub fn new(me: PeerId, spec: FragmentSpec, state: FragmentState, peers: usize) -> Self {
        let numel = spec.numel();
        let state_round = state.round;
        Self {
            spec,
            state_hash: state.hash(),
            state_bytes: OnceLock::new(),
            state,
            feedback: ErrorFeedback::new(numel),
            banked: (0, 0),
            votes: Votes::new(me, peers),
            held: FastMap::default(),
            held_bytes: 0,
            claims: FastMap::default(),
            equivocators: FastSet::default(),
            open: None,
            state_fetch: None,
            last_snapshot_at: None,
            closed_round: 0,
            prior: None,
            prior_before: None,
            overtaken: None,
            recipe_wait: None,
            recipes_given_up: None,
            recipes: FastMap::default(),
            recipes_before: FastMap::default(),
            listed: FastMap::default(),
            check: None,
            checked: None,
            weighing: None,
            announced_round: state_round,
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
        let vouched = counts && self.votes.vouches(&h.origin);
        self.claims.insert((h.origin, h.round), hash);
        self.held_bytes += h.bytes.len() as u64;
        if let Some(old) = self.held.insert(hash, h) {
            self.held_bytes -= old.bytes.len() as u64;
        }
        if counts {
            if let Some(o) = self.open.as_mut() {
                o.eligible += 1;
                o.vouched += usize::from(vouched);
            }
        }
        counts
    }

    /// Opens `round`: counts what is already pending for it.
    pub fn open_round(
        &mut self,
        round: u64,
        now: Millis,
        w: Window,
        quorum: usize,
        m: &mut Metrics,
    ) {
        // Pruning here too (not only after merges) bounds memory when rounds keep being
        // skipped, e.g. with a quorum that never comes.
        self.prune(round, w, m);
        let (eligible, vouched) = self.pending_for(round, w);
        let wide_at = match (w.lag, self.state.round) {
            (0, 0) => usize::MAX,
            (0, _) if self.state.sampling.period > 1 => {
                let (s, fragment) = (self.state.sampling, self.spec.id);
                quorum.max(self.votes.credited_where(|p| s.publishes(p, fragment, round)))
            }
            (0, _) => quorum.max((self.votes.credited() + 1).div_ceil(2)),
            _ => quorum,
        };
        self.open = Some(OpenRound {
            round,
            opened_at: now,
            quorum_at: None,
            grace_ms: 0,
            wide_at,
            narrow: false,
            eligible,
            vouched,
            closed: false,
            awaiting_snapshot: false,
        });
    }

    /// How many pending contributions are eligible for `round`, and how many of those
    /// [`Votes::vouches`] for.
    pub fn pending_for(&self, round: u64, w: Window) -> (usize, usize) {
        let pending =
            self.held.values().filter(|h| h.merged_at.is_none() && w.eligible(h.round, round));
        pending.fold((0, 0), |(n, v), h| (n + 1, v + usize::from(self.votes.vouches(&h.origin))))
    }

    /// Merges the open round's eligible contributions into the state (DESIGN.md §2.3).
    /// Returns the outputs and the contributions dropped because they made the merge
    /// non-finite (the caller refuses them from then on).
    pub fn merge(
        &mut self,
        me: PeerId,
        settings: &Settings,
        limits: &Limits,
        now: Millis,
        m: &mut Metrics,
    ) -> (Vec<Output>, Vec<ContentHash>) {
        let r = settings.raw();
        let w = Window::of(settings);
        let Some(open) = self.open.as_mut() else { return (Vec::new(), Vec::new()) };
        open.closed = true;
        self.closed_round = self.closed_round.max(open.round);
        let (round, opened_at, quorum_at, grace_ms) =
            (open.round, open.opened_at, open.quorum_at, open.grace_ms);
        let pending: Vec<ContentHash> = self
            .held
            .iter()
            .filter(|(_, h)| h.merged_at.is_none() && w.eligible(h.round, round))
            .map(|(hash, _)| *hash)
            .collect();
        let decoded = held::decode(&self.held, &self.spec, &pending, settings, limits);
        let mut inputs = merge_inputs(&decoded);
        // The incremental count can overstate what is mergeable (a counted delta may have
        // been found merged by an adopted state since); the set itself decides.
        if inputs.len() < r.quorum {
            m.skipped_rounds += 1;
            let skipped = Output::Skipped { fragment: self.spec.id, round, contested: false };
            return (vec![skipped], Vec::new());
        }
        merge::canonical_order(&mut inputs);
        let merge::Step { anchor, momentum, dropped, agreement } = merge::robust_step(
            &self.spec,
            &mut inputs,
            &self.state.anchor,
            &self.state.momentum,
            settings,
            self.state.sampling.outer(r),
        );
        m.nonfinite_dropped += dropped.len() as u64;
        for hash in &dropped {
            if let Some(h) = self.held.remove(hash) {
                self.held_bytes -= h.bytes.len() as u64;
            }
        }
        // Nothing agreed (two deltas pointing apart, or only zero ones): no direction to
        // trust. The round is skipped rather than merged as a no-op, so what arrived stays
        // pending for a larger set and the trainers keep their progress.
        if inputs.is_empty() || agreement.iter().all(|&a| a == 0.0) {
            m.skipped_rounds += 1;
            let contested = !inputs.is_empty();
            let skipped = Output::Skipped { fragment: self.spec.id, round, contested };
            return (vec![skipped], dropped);
        }
        let before = self.state.replace_values(anchor, momentum);
        self.prior_before = self.prior.replace((self.state_hash, before));
        self.state.parent = self.state_hash;
        let merged: Vec<ContentHash> = inputs.iter().map(|i| i.hash).collect();
        drop(inputs);
        self.state.round = round;
        let earlier = self.made_before(&merged, round);
        self.state.record_merge(round, merged.clone(), earlier, w.log_rounds(), r.contributors);
        let mut late = 0;
        let mut contributions = Vec::with_capacity(merged.len());
        for (hash, &agreement) in merged.iter().zip(&agreement) {
            if let Some(h) = self.held.get_mut(hash) {
                contributions.push(Contribution { origin: h.origin, tokens: h.tokens, agreement });
                late += usize::from(h.round.saturating_add(w.lag) < round);
                h.merged_at = Some(round);
                // Work that went the round's way is what earns a vote (DESIGN.md §3.2).
                if agreement > 0.0 {
                    self.votes.credit(h.origin, h.round);
                } else {
                    m.disagreed += 1;
                    m.refused(h.origin);
                }
            }
        }
        let bytes = Bytes::from(self.state.to_bytes());
        self.state_hash = ContentHash::of(&bytes);
        self.state_bytes = OnceLock::from(bytes);
        self.votes.set_mine(round, self.state_hash, self.state.took(), self.state.parent);
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
        // In a sampled swarm only the round's contributors announce the state: their votes
        // are the ones that count, and N announcements a round would be the traffic that
        // sampling removes.
        let announce =
            self.state.sampling.period <= 1 || report.contributions.iter().any(|c| c.origin == me);
        (self.after_state_change(settings, Output::Merged(report), announce), dropped)
    }

    /// Outputs shared by merge and adoption: the anchor for the trainer, the state
    /// announcement (if `announce`), and the report.
    fn after_state_change(
        &mut self,
        settings: &Settings,
        report: Output,
        announce: bool,
    ) -> Vec<Output> {
        let apply = ApplyAnchor {
            fragment: self.spec.id,
            round: self.state.round,
            anchor: self.state.anchor.clone(),
            alpha: settings.raw().alpha,
        };
        if announce {
            vec![Output::Apply(apply), self.announcement(), report]
        } else {
            vec![Output::Apply(apply), report]
        }
    }

    /// How many of the held deltas `ids` were made for a round before `round` (merge lag,
    /// late arrivals): they may have been published under the previous sampling period
    /// (`Sampling::after_merge`).
    pub fn made_before(&self, ids: &[ContentHash], round: u64) -> usize {
        ids.iter().filter(|h| self.listed_delta(h).is_some_and(|d| d.round < round)).count()
    }

    /// Delta `hash`, held or fetched for a state check.
    pub fn listed_delta(&self, hash: &ContentHash) -> Option<&Held> {
        self.held.get(hash).or_else(|| self.listed.get(hash))
    }

    /// Whether a state check waits for delta `hash`.
    pub fn awaits(&self, hash: &ContentHash) -> bool {
        self.check.as_ref().is_some_and(|c| c.waiting.contains(hash))
    }

    /// The announcement of this lane's state (with its payload, to serve); notes its round
    /// as announced.
    pub fn announcement(&mut self) -> Output {
        self.announced_round = self.announced_round.max(self.state.round);
        let state = super::Message::State(super::StateAnnounce {
            fragment: self.spec.id as u32,
            round: self.state.round,
            hash: self.state_hash,
            size: self.state.wire_len() as u64,
            took: Some(self.state.took()),
            recipe: self.recipe(),
            parent: Some(self.state.parent),
        });
        Output::Publish { msg: state, payload: self.state_bytes().clone() }
    }

    /// Drops contributions too old to merge; unmerged ones are counted as stale.
    fn prune(&mut self, round: u64, w: Window, m: &mut Metrics) {
        let mut freed = 0;
        self.held.retain(|_, h| {
            let keep = !w.stale(h.round, round);
            if !keep {
                freed += h.bytes.len() as u64;
                if h.merged_at.is_none() {
                    m.stale_dropped += 1;
                }
            }
            keep
        });
        self.held_bytes -= freed;
        self.claims.retain(|(_, r), _| !w.stale(*r, round));
        self.equivocators.retain(|(_, r)| !w.stale(*r, round));
        self.votes.prune(round, w.log_rounds(), self.state.sampling.period);
        for recipes in [&mut self.recipes, &mut self.recipes_before] {
            recipes.retain(|_, (_, r, _)| r.saturating_add(w.log_rounds()) >= round);
        }
    }
}
