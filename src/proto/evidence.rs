//! Evidence for a state before it is adopted (DESIGN.md §3.6).
//!
//! A state names its parent (the state its merge started from) and, as its log's last
//! entry, the contributions that merge took. A peer that holds that parent — its current
//! state, or the one before its latest merge or adoption, which is where a competing state
//! of the same round starts — and holds every delta listed can redo the merge: the merge
//! is deterministic, so an honest state comes out bit for bit, and anything else is a
//! forgery, whoever voted for it. A state nobody here can recompute (another lineage, a
//! late joiner, a delta we never got) is adopted only with at least half of the round's
//! counted voters behind it, not a mere plurality (src/proto/catchup.rs).

use super::fasthash::FastMap;
use super::held::{self, merge_inputs};
use super::lane::{Lane, Window};
use super::merge;
use super::state::FragmentState;
use super::Settings;
use crate::delta::{ContentHash, Limits};

/// What recomputing a fetched state showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Evidence {
    /// Recomputed bit for bit from a parent and deltas this peer holds.
    Verified,
    /// Recomputing it gives another state (or it lists a delta that cannot be merged).
    Forged(String),
    /// This peer lacks the parent or a listed delta.
    Unverifiable,
}

impl Lane {
    /// Recomputes `new` (whose hash is `hash`) from its parent and contributions, if this
    /// peer holds them.
    pub fn evidence(
        &self,
        new: &FragmentState,
        hash: ContentHash,
        settings: &Settings,
        limits: &Limits,
    ) -> Evidence {
        let base = if new.parent == self.state_hash {
            Some(&self.state)
        } else {
            self.prior.as_ref().filter(|(h, _)| *h == new.parent).map(|(_, s)| s)
        };
        let Some(base) = base else { return Evidence::Unverifiable };
        let Some((round, ids)) = new.log.back().filter(|(r, _)| *r == new.round) else {
            return Evidence::Unverifiable;
        };
        let by_short: FastMap<u64, ContentHash> =
            self.held.keys().map(|h| (h.short(), *h)).collect();
        let Some(listed) =
            ids.iter().map(|id| by_short.get(id).copied()).collect::<Option<Vec<_>>>()
        else {
            return Evidence::Unverifiable;
        };
        let decoded = held::decode(&self.held, &self.spec, &listed, settings, limits);
        if decoded.len() != listed.len() {
            return Evidence::Unverifiable;
        }
        let mut inputs = merge_inputs(&decoded);
        merge::canonical_order(&mut inputs);
        let step =
            merge::robust_step(&self.spec, &mut inputs, &base.anchor, &base.momentum, settings);
        if !step.dropped.is_empty() {
            return Evidence::Forged(format!(
                "state of round {round} merges {} contribution(s) that make the merge non-finite",
                step.dropped.len()
            ));
        }
        let mut redone = base.clone();
        redone.anchor = step.anchor;
        redone.momentum = step.momentum;
        redone.round = *round;
        redone.parent = new.parent;
        redone.record(*round, ids.clone(), Window::of(settings).log_rounds());
        if redone.hash() == hash {
            Evidence::Verified
        } else {
            Evidence::Forged(format!(
                "state of round {round} is not what its parent and its {} contribution(s) give",
                ids.len()
            ))
        }
    }
}
