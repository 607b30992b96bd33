//! Weighing a state before it is adopted (DESIGN.md §3.2; SECURITY.md, "A forged state
//! nobody can recompute").
//!
//! Votes say who holds a state, not whether it is any good. A state that nothing here can
//! recompute and that no majority holds — the ruling lineage's state of a split swarm,
//! whose tie with another lineage goes to a parent hash colluders can grind, or, without
//! strict states, a plurality's — is weighed first: the core asks the executor's trainer
//! for the validation loss with the state's anchor and with its own ([`Output::Weigh`]),
//! and adopts it only if it is no worse than [`WORSE_MARGIN`] (`Protocol::on_weighed`).
//! A state most of the counted voters hold is weighed too, by a peer with a trained state
//! of its own, against the loose [`POISON_MARGIN`]: a peer that counts few voters can count
//! more colluders than honest peers.
//! Adoption is each peer's own decision, so unlike a merge weight the verdict need not be
//! the same bits on every machine.

use super::check::Offer;
use super::core::Protocol;
use super::io::{Losses, Output};
use super::schedule::Millis;
use super::state::FragmentState;
use crate::delta::ContentHash;

/// How much worse (relative to its own loss) than this peer's own anchor a state it
/// weighs may be on the trainer's validation data and still be adopted: two honest
/// lineages a round or two apart differ by less (bench/RESULTS.md, "States weighed before
/// they are adopted"), a poisoned anchor by far more.
pub const WORSE_MARGIN: f64 = 0.02;

/// The same for a state most of the counted voters hold: only a state more than 4× worse
/// than the peer's own is refused. After a partition the majority's honest state can be
/// 2.6× worse than a minority peer's own (the simulator's partition test), and the swarm
/// must still come together on it; the simulator's poisoned states were 6× to 10¹² worse
/// (bench/RESULTS.md, "States weighed before they are adopted": 8× let some through). A
/// language model's whole training spans 3–6× (ln 256 ≈ 5.5 nats a byte at
/// initialisation, 1–1.8 trained): a state refused so is about as bad as an untrained one
/// against a well-trained peer.
pub const POISON_MARGIN: f64 = 3.0;

/// A fetched state the trainer is weighing ([`Output::Weigh`]).
#[derive(Debug, Clone)]
pub(crate) struct Weighing {
    pub offer: Offer,
    pub state: FragmentState,
    /// When the trainer was asked: an answer that never comes frees the lane a period on.
    pub asked_at: Millis,
    /// How much worse than the own anchor it may be ([`WORSE_MARGIN`], [`POISON_MARGIN`]).
    pub margin: f64,
}

impl Protocol {
    /// Asks the trainer to weigh `state`, fetched as `offer`, against this peer's own
    /// anchor before it is adopted, to be no worse than `margin` allows. Refusing it is
    /// not a provable offence: nobody is reported for it.
    pub(super) fn ask_weigh(
        &mut self,
        offer: Offer,
        state: FragmentState,
        margin: f64,
        p: usize,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let lane = &mut self.lanes[p];
        // Named while it is weighed (an offer of it again, from a check that ended, must not
        // free the lane for another fetch of it).
        lane.state_fetch = Some(offer.hash);
        if lane.weighing.as_ref().is_some_and(|w| w.offer.hash == offer.hash) {
            return;
        }
        out.push(Output::Weigh {
            fragment: p,
            round: state.round,
            hash: offer.hash,
            anchor: state.anchor.clone(),
            own: lane.state.anchor.clone(),
            margin,
        });
        lane.weighing = Some(Weighing { offer, state, asked_at: now, margin });
        self.metrics.weighed_states += 1;
    }

    /// The trainer's verdict on a state it weighed: adopted if no worse than this peer's
    /// own by more than its margin (or if it could not be weighed), else refused for
    /// a period like a state too few voters back, and the next best state leads.
    pub(super) fn on_weighed(
        &mut self,
        p: usize,
        hash: ContentHash,
        losses: Option<Losses>,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let Some(lane) = self.lanes.get_mut(p) else { return };
        if lane.weighing.as_ref().is_none_or(|w| w.offer.hash != hash) {
            return;
        }
        let Some(Weighing { offer, state, margin, .. }) = lane.weighing.take() else { return };
        lane.state_fetch = None;
        if losses.is_some_and(|l| !l.passes(margin)) {
            self.metrics.worse_states += 1;
            return self.refuse_state(offer.from, hash, now);
        }
        self.take(offer, state, p, out);
    }

    /// Frees a lane whose weighing was never answered within a period (a trainer that
    /// stopped): its state is fetched again if it still leads.
    pub(super) fn drop_stale_weighing(&mut self, p: usize, now: Millis) {
        let period = self.settings.period_ms();
        let lane = &mut self.lanes[p];
        if lane.weighing.as_ref().is_some_and(|w| now >= w.asked_at.saturating_add(period)) {
            lane.weighing = None;
            lane.state_fetch = None;
        }
    }
}
