//! The leaderless Decoupled DiLoCo protocol core — I/O-free (DESIGN.md §2.3, §3).
//!
//! Every peer is learner and syncer at once. Per fragment `p` it keeps a replicated
//! [`FragmentState`] (anchor, Nesterov buffer, round, log of merged contribution ids) and
//! runs rounds on a schedule all peers share ([`Schedule`]: round `r` opens at
//! `r·T + p·T/P` on the run's timeline). A round goes:
//!
//! 1. **Open**: the core asks the trainer for a [`Output::Snapshot`] of the fragment; the
//!    delta `anchor − θ` (+ error feedback) is encoded ([`crate::delta`]) and announced.
//! 2. **Collect**: announcements are fetched by content hash and validated; once `K`
//!    contributions (own included) are held, the adaptive [`Grace`] window (Eq. 3) starts.
//!    If the quorum never comes, the round is skipped after `max_wait_ms`.
//! 3. **Merge**: all eligible contributions — this round's and late ones from up to
//!    `max_lateness` earlier rounds, never one already in the state's log — are combined in
//!    hash order with token weights and RDA ([`merge`]), then the outer Nesterov step.
//!    The trainer gets [`Output::Apply`] and the peer announces its new state hash.
//! 4. **Reconcile**: half a period later the peer compares its state hash with the latest
//!    hashes of the others ([`reconcile::Votes`]); if the majority (ties: smallest hash)
//!    holds another state — or a later round, when this peer fell behind — it fetches that
//!    state and adopts it, re-queueing what it had merged that the adopted lineage had not.
//!
//! Since merges are deterministic and a peer that disagrees adopts the majority's state,
//! anchors become bit-identical once churn stops (tests/simulator/agreement.rs).
//!
//! Drive it with [`Protocol::handle`]`(event, now)` and carry out the [`Output`]s (a
//! running peer wraps it in [`crate::peer::Peer`], which also answers payload requests).
//! Time and randomness are inputs.
//!
//! ```
//! use atoll::fragment::{FragmentPlan, TensorSpec};
//! use atoll::proto::{Event, Output, PeerId, Protocol, RawSettings, Settings};
//!
//! let tensors = vec![
//!     TensorSpec { name: "emb".into(), shape: vec![16, 4], is_embedding: true },
//!     TensorSpec { name: "w".into(), shape: vec![4, 4], is_embedding: false },
//! ];
//! let plan = FragmentPlan::new(&tensors, 2).unwrap();
//! let settings = Settings::new(RawSettings { fragments: 2, ..RawSettings::default() }).unwrap();
//! // Every peer starts from the same initial parameters (the run's seed).
//! let init: Vec<Vec<f32>> = plan.fragments.iter().map(|f| vec![0.0; f.numel()]).collect();
//! let mut proto = Protocol::new(PeerId(7), settings, &plan, init, 42).unwrap();
//! let mut queue = proto.start(0); // ms on the run's timeline
//! let mut timers = Vec::new();
//! while let Some(out) = queue.pop() {
//!     match out {
//!         Output::SetTimer { at, timer } => timers.push((at, timer)),
//!         Output::Snapshot { fragment, round } => {
//!             // Between two inner steps: the trainer's fragment and its counters.
//!             let params = vec![0.01; plan.fragments[fragment].numel()];
//!             let ev = Event::Snapshot { fragment, round, params, tokens: 4096, steps: 8 };
//!             queue.extend(proto.handle(ev, 5_000));
//!         }
//!         Output::Publish { msg, .. } => { let _bytes = atoll::proto::encode_message(&msg); }
//!         Output::Fetch { .. } | Output::Apply(_) | Output::Merged(_) => {}
//!         _ => {}
//!     }
//!     // A real node sleeps until the earliest timer, then feeds it back:
//!     if queue.is_empty() && !timers.is_empty() {
//!         timers.sort();
//!         let (at, timer) = timers.remove(0);
//!         if at > 6_000 { break; }
//!         queue.extend(proto.handle(Event::Timer(timer), at));
//!     }
//! }
//! assert_eq!(proto.metrics().published, 1); // fragment 0's delta of round 1
//! ```

mod catchup;
mod check;
mod core;
mod evidence;
mod fasthash;
mod fetch;
mod held;
mod intake;
mod io;
mod lane;
pub mod merge;
mod message;
pub mod reconcile;
pub mod sampling;
mod schedule;
mod settings;
pub mod state;
mod weigh;

pub use self::core::{ProtoError, Protocol, MAX_IN_FLIGHT, MAX_PEERS};
pub use evidence::FetchCause;
pub use io::{
    ApplyAnchor, Contribution, Event, FetchCauses, Losses, MergeReport, Metrics, Offence, Output,
    Timer, MAX_REFUSED_FROM,
};
pub use merge::consensus_distance;
pub use message::{
    decode_message, encode_message, ContributionAnnounce, Message, MessageError, PeerId, Recipe,
    StateAnnounce, MAX_MESSAGE_BYTES, MAX_RECIPE_IDS, PROTOCOL_VERSION, TOPIC_PREFIX,
};
pub use schedule::{Ema, Grace, Millis, Schedule};
pub use settings::{MergeRule, RawSettings, Settings, SettingsError};
pub use state::{FragmentState, StateError};
pub use weigh::{POISON_MARGIN, WORSE_MARGIN};

#[cfg(test)]
pub(crate) mod tests;
