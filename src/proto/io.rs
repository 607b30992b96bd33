//! What goes into the protocol core and what comes out of it.
//!
//! The core never sleeps, sends or reads a clock: the node (or the simulator) feeds it
//! [`Event`]s with the current time and carries out the [`Output`]s.

use super::{Message, Millis, PeerId};
use crate::delta::ContentHash;
use bytes::Bytes;

/// Timers the core asks for; they come back as [`Event::Timer`] at or after `at`.
/// Timers are never cancelled; the core ignores those that no longer apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Timer {
    /// Round `round` of `fragment` opens: snapshot, publish, start waiting for the quorum.
    Open { fragment: usize, round: u64 },
    /// The grace window after the quorum ended: merge now.
    Close { fragment: usize, round: u64 },
    /// The quorum did not come in time: skip the round (what arrived stays pending).
    Deadline { fragment: usize, round: u64 },
    /// Compare state hashes with the other peers; fetch the majority state if ours differs.
    Reconcile { fragment: usize, round: u64 },
    /// Retry (elsewhere) or give up the fetches whose attempt timed out.
    FetchSweep,
}

/// Inputs.
#[derive(Debug, Clone)]
pub enum Event {
    Timer(Timer),
    /// Answer to [`Output::Snapshot`]: the trainer's current parameters of the fragment and
    /// the tokens and inner steps counted since the previous snapshot of this fragment.
    /// With `steps == 0` nothing is published.
    Snapshot {
        fragment: usize,
        round: u64,
        params: Vec<f32>,
        tokens: u64,
        steps: u64,
    },
    /// A gossip message (already decoded with [`super::decode_message`]).
    Message {
        from: PeerId,
        msg: Message,
    },
    /// Answer to [`Output::Fetch`]; the core verifies the hash itself.
    Fetched {
        from: PeerId,
        hash: ContentHash,
        bytes: Bytes,
    },
    /// A fetch failed: no holder delivered it (gone, refused, too large, too slow). The
    /// core does not retry: the executor already tried every holder it was given.
    /// `denied`: the holders that answered that they do not hold it; `silent`: the ones
    /// that did not answer at all in the time a holder takes.
    FetchFailed {
        from: PeerId,
        hash: ContentHash,
        denied: Vec<PeerId>,
        silent: Vec<PeerId>,
    },
    /// Answer to [`Output::Weigh`]: the trainer's loss on its validation data with the
    /// fragment set to the offered anchor, and with it set to this peer's own anchor (the
    /// rest of the model as it is). `None`: it could not be weighed (no trainer any more),
    /// and the state is judged on its votes alone.
    Weighed {
        fragment: usize,
        hash: ContentHash,
        losses: Option<Losses>,
    },
}

/// The two losses of an [`Event::Weighed`], measured on the same data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Losses {
    /// With the offered state's anchor.
    pub offered: f64,
    /// With this peer's own anchor.
    pub own: f64,
}

impl Losses {
    /// Whether the offered anchor is no worse than the own one by more than `margin`
    /// (relative). A non-finite offered loss never passes; a non-finite own loss (a peer
    /// whose own anchor diverged) takes any finite one.
    pub fn passes(&self, margin: f64) -> bool {
        self.offered.is_finite()
            && (!self.own.is_finite() || self.offered <= self.own * (1.0 + margin))
    }
}

/// The trainer should take this anchor for the fragment between two inner steps:
/// `θ ← α·θ + (1−α)·anchor`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApplyAnchor {
    pub fragment: usize,
    pub round: u64,
    pub anchor: Vec<f32>,
    pub alpha: f32,
}

/// What a merge did, for metrics, status and tests.
#[derive(Debug, Clone, PartialEq)]
pub struct MergeReport {
    pub fragment: usize,
    pub round: u64,
    /// Hash of the resulting state (anchor + momentum + merged-id log).
    pub state_hash: ContentHash,
    /// Contributions merged, in canonical (hash) order.
    pub merged: Vec<ContentHash>,
    /// Who made each of them and how many tokens it covers (same order as `merged`).
    pub contributions: Vec<Contribution>,
    /// How many of them were made for an earlier round (late arrivals).
    pub late: usize,
    /// Time from the round opening to the merge.
    pub since_open_ms: Millis,
    /// Time from the quorum being held to the merge (the grace actually waited).
    pub waited_ms: Millis,
    /// The grace window in force when the quorum was reached.
    pub grace_ms: Millis,
}

/// One merged contribution's origin, size and agreement with its round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Contribution {
    pub origin: PeerId,
    pub tokens: u64,
    /// Its weight factor for agreeing with its round (`merge::agreement`), in `[0, 1]`: 0 for a
    /// delta that went against the round (it was merged with no weight and earned its
    /// author no credit).
    pub agreement: f64,
}

/// Outputs.
#[derive(Debug, Clone)]
pub enum Output {
    /// Make `payload` (the bytes `msg` announces, under their hash) available to others,
    /// then gossip `msg` (encode with [`super::encode_message`]).
    Publish { msg: Message, payload: Bytes },
    /// Fetch the payload `hash` (at most `max_len` bytes) from any of `holders` (start
    /// with the first: the core spreads load by the order) by `deadline`. Issued once per
    /// hash: the executor owns sources, hedging, retries and timeouts, and answers exactly
    /// once, with [`Event::Fetched`] or [`Event::FetchFailed`] (naming a holder), unless
    /// [`Output::CancelFetch`] came first. Others are served by `Peer::payload`.
    Fetch { hash: ContentHash, holders: Vec<PeerId>, max_len: u64, deadline: Millis },
    /// Stop fetching `hash` (its deadline passed); no answer is expected.
    CancelFetch { hash: ContentHash },
    /// Deliver [`Event::Timer`] with `timer` at time `at`.
    SetTimer { at: Millis, timer: Timer },
    /// Take a snapshot of the fragment's parameters and counters; answer with
    /// [`Event::Snapshot`] (the trainer keeps training meanwhile). Always answer, with
    /// `steps = 0` if nothing was trained, and before applying any later
    /// [`Output::Apply`] of the fragment: the round does not close until the answer came
    /// (or `max_wait_ms` passed).
    Snapshot { fragment: usize, round: u64 },
    /// A new anchor for the trainer.
    Apply(ApplyAnchor),
    /// Evaluate `anchor` (of state `hash`, offered for adoption) and `own` (this peer's
    /// anchor of the fragment) on the trainer's validation data and answer with
    /// [`Event::Weighed`]; the trainer's own parameters stay as they were. Asked only of an
    /// executor that said it weighs ([`super::Protocol::set_weighing`]), once per offered
    /// state, before a state nothing here can recompute is adopted (src/proto/weigh.rs).
    /// `margin`: how much worse it may be and still be adopted ([`Losses::passes`]), for
    /// the executor's logs.
    Weigh {
        fragment: usize,
        round: u64,
        hash: ContentHash,
        anchor: Vec<f32>,
        own: Vec<f32>,
        margin: f64,
    },
    /// The fragment's error-feedback residual now holds work of `round` that waits for
    /// this peer's slot (sampled contributions): keep it with the anchors, as after
    /// publishing, so a restart sends it.
    Banked { fragment: usize, round: u64 },
    /// A round was merged.
    Merged(MergeReport),
    /// A round closed without a merge; its contributions stay pending. `contested`: the
    /// quorum was there but nothing agreed (every contribution weightless), so the swarm is
    /// still at work on the round rather than quiet.
    Skipped { fragment: usize, round: u64, contested: bool },
    /// The fragment's state was replaced by the majority's (reconciliation or catch-up).
    Adopted { fragment: usize, round: u64, hash: ContentHash, previous_round: u64 },
    /// A peer sent something invalid: log it and lower its score.
    Misbehaved { peer: PeerId, offence: Offence, detail: String },
}

/// What a peer did wrong; every variant is provable from what it sent (a signed
/// announcement or a payload it served), never a statistical judgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Offence {
    /// A message about a fragment the run does not have.
    UnknownFragment,
    /// An announcement of a payload above the size limit.
    Oversized,
    /// An announcement that names another peer as the delta's author.
    ForgedAuthor,
    /// Claims the manifest rules out (more tokens than its steps can hold, zero steps).
    InflatedClaim,
    /// A second, different delta from one author for one fragment round.
    Equivocation,
    /// A payload whose header contradicts the announcement it was fetched for.
    ClaimMismatch,
    /// Bytes that do not match their hash, or that do not decode.
    BadPayload,
    /// A state whose round is not the one voted for, or that cannot exist yet.
    BadState,
    /// A state that recomputing from its parent and contributions does not give.
    ForgedState,
    /// A delta its author announced, then said it does not hold, while the round was open.
    Unserved,
}

impl Offence {
    /// Short name, for logs and the `rejected` counts in `status.json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Offence::UnknownFragment => "unknown_fragment",
            Offence::Oversized => "oversized",
            Offence::ForgedAuthor => "forged_author",
            Offence::InflatedClaim => "inflated_claim",
            Offence::Equivocation => "equivocation",
            Offence::ClaimMismatch => "claim_mismatch",
            Offence::BadPayload => "bad_payload",
            Offence::BadState => "bad_state",
            Offence::ForgedState => "forged_state",
            Offence::Unserved => "unserved",
        }
    }
}

impl std::fmt::Display for Offence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Most peers whose refusals are counted by name ([`Metrics::refused_from`]).
pub const MAX_REFUSED_FROM: usize = 64;

/// State fetches by why the state was not recomputed from its recipe
/// ([`super::evidence::FetchCause`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchCauses {
    pub no_recipe: u64,
    pub no_parent: u64,
    pub missing_deltas: u64,
    pub recipe_failed: u64,
    pub retry: u64,
}

impl FetchCauses {
    pub fn count(&mut self, cause: super::evidence::FetchCause) {
        use super::evidence::FetchCause::*;
        let n = match cause {
            NoRecipe => &mut self.no_recipe,
            NoParent => &mut self.no_parent,
            MissingDeltas => &mut self.missing_deltas,
            RecipeFailed => &mut self.recipe_failed,
            Retry => &mut self.retry,
        };
        *n += 1;
    }

    /// By name, for `status.json`.
    pub fn named(&self) -> [(&'static str, u64); 5] {
        [
            ("no_recipe", self.no_recipe),
            ("no_parent", self.no_parent),
            ("missing_deltas", self.missing_deltas),
            ("recipe_failed", self.recipe_failed),
            ("retry", self.retry),
        ]
    }
}

/// Counters on the hot paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Refusals by the peer they are owed to (the author of a delta merged with no weight
    /// or announced off its slot, the source of a state refuted or left unbacked, the
    /// holder that did not serve in time): at most [`MAX_REFUSED_FROM`] peers, the least
    /// refused making room for a new one, so one rotating its ids cannot push out a peer
    /// refused again and again.
    pub refused_from: std::collections::BTreeMap<PeerId, u64>,
    pub published: u64,
    pub published_bytes: u64,
    /// Snapshots outside this peer's slot whose work went into the residual instead of a
    /// delta (runs that sample contributions).
    pub banked: u64,
    /// Snapshots too far before this peer's next slot to be banked: their work is not sent.
    pub unsent: u64,
    /// Announcements of deltas outside their author's slot, not fetched.
    pub off_slot: u64,
    pub merges: u64,
    pub skipped_rounds: u64,
    pub merged_contributions: u64,
    pub late_merged: u64,
    pub stale_dropped: u64,
    pub adoptions: u64,
    /// Adoptions of a state recomputed here from its recipe (no state fetched).
    pub recomputed: u64,
    /// State fetches started, by why the state could not be recomputed instead.
    pub state_fetch_causes: FetchCauses,
    pub resurrected: u64,
    pub fetches: u64,
    pub fetch_failures: u64,
    /// Holders of failed fetches that did not answer at all (each one counted).
    pub silent_holders: u64,
    /// Bytes of fetched payloads that checked out against their hash, by kind.
    pub fetched_delta_bytes: u64,
    pub fetched_state_bytes: u64,
    pub rejected: u64,
    /// Contributions dropped because they made a merge non-finite.
    pub nonfinite_dropped: u64,
    /// Contributions merged with no weight because they went against their round
    /// (`agreement_weights`).
    pub disagreed: u64,
    /// Fetched states that recomputing from their parent and contributions refuted.
    pub forged_states: u64,
    /// Fetched states nobody here could recompute, left for lack of a backing majority.
    pub unbacked_states: u64,
    /// Fetched states weighed on the trainer's validation data before adoption
    /// (`Output::Weigh`).
    pub weighed_states: u64,
    /// Fetched states that the trainer found worse than this peer's own on its
    /// validation data (`Output::Weigh`), left although their votes would have taken them.
    pub worse_states: u64,
    /// Fetched states made on a parent held here whose missing deltas were fetched to
    /// recompute them (src/proto/check.rs).
    pub state_checks: u64,
    pub refused_full: u64,
}

impl Metrics {
    /// Counts one refusal owed to `peer` (see [`Metrics::refused_from`]).
    pub fn refused(&mut self, peer: PeerId) {
        let map = &mut self.refused_from;
        if map.len() >= MAX_REFUSED_FROM && !map.contains_key(&peer) {
            // The least refused goes (ties: the smallest id), whatever order they came in.
            if let Some(least) = map.iter().min_by_key(|(p, n)| (**n, **p)).map(|(p, _)| *p) {
                map.remove(&least);
            }
        }
        *map.entry(peer).or_default() += 1;
    }

    /// The `n` most refused peers, most first (ties: the smallest id).
    pub fn most_refused(&self, n: usize) -> Vec<(PeerId, u64)> {
        let mut v: Vec<(PeerId, u64)> = self.refused_from.iter().map(|(p, c)| (*p, *c)).collect();
        v.sort_by_key(|&(p, c)| (std::cmp::Reverse(c), p));
        v.truncate(n);
        v
    }

    /// Payload bytes by kind, for operators: where a peer's traffic goes (its own deltas,
    /// the others' deltas, whole states when its merge set differed from the swarm's).
    pub fn payload_bytes(&self) -> [(&'static str, u64); 3] {
        [
            ("delta_published", self.published_bytes),
            ("delta_fetched", self.fetched_delta_bytes),
            ("state_fetched", self.fetched_state_bytes),
        ]
    }

    /// What this peer did not take, by cause, for operators (`status.json`, `/metrics`,
    /// the status page): none of these is provable misconduct, but a stalling or flooding
    /// peer shows here first.
    pub fn refusals(&self) -> [(&'static str, u64); 9] {
        [
            // Announced payloads that no holder served in time (a stall, or a lost peer).
            ("fetch_failed", self.fetch_failures),
            // Holders of those that did not answer at all (a silent stall, a paused peer).
            ("silent", self.silent_holders),
            // Announcements dropped because the held-bytes budget or a queue was full.
            ("budget_full", self.refused_full),
            // Fetched states that recomputing from their parent refuted.
            ("forged_state", self.forged_states),
            // Fetched states that nobody could recompute and no majority backed.
            ("unbacked_state", self.unbacked_states),
            // Fetched states worse than this peer's own on its validation data.
            ("worse_state", self.worse_states),
            // Contributions that made a merge non-finite.
            ("nonfinite", self.nonfinite_dropped),
            // Contributions merged with no weight: they went against their round.
            ("disagreed", self.disagreed),
            // Deltas announced outside their author's slot (runs that sample contributions).
            ("off_slot", self.off_slot),
        ]
    }
}
