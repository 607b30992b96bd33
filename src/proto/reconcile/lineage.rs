//! Lineages: the parents a round's voters claim their states were merged on, and which
//! of them a peer follows (DESIGN.md §3.6).

use super::{Vote, Votes};
use crate::delta::ContentHash;
use crate::proto::fasthash::FastMap;
use crate::proto::PeerId;

/// The parent whose states a round's votes follow ([`Votes::ruling_lineage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lineage {
    pub parent: ContentHash,
    /// Claimed by most of the round's counted voters (else only by the most of them).
    pub majority: bool,
}

impl Votes {
    /// The counted holders of `hash` for `round` other than this peer that claimed it was
    /// merged on another state than `parent`, the one it names: like a false count, a vote
    /// for a state the voter does not hold, or a lie to lend it a lineage.
    pub fn misparented(&self, round: u64, hash: ContentHash, parent: ContentHash) -> Vec<PeerId> {
        let mut h = self.holders(round, hash);
        let claim = |p: &PeerId| self.latest.get(p).and_then(|v| v.parent);
        h.retain(|p| *p != self.me && claim(p).is_some_and(|c| c != parent));
        h
    }

    /// `round`'s counted voters that claim their state was merged on `parent`, in id order.
    pub fn kin(&self, round: u64, parent: ContentHash) -> Vec<PeerId> {
        let same = |v: &Vote| v.round == round && v.parent == Some(parent);
        let mut k: Vec<PeerId> = self.counted().filter(|(_, v)| same(v)).map(|(p, _)| *p).collect();
        k.sort_unstable();
        k
    }

    /// How many of `round`'s counted voters hold a state they claim was merged on
    /// `parent` (whichever set it took), and how many voted for the round at all.
    pub fn lineage(&self, round: u64, parent: ContentHash) -> (usize, usize) {
        let (mut same, mut all) = (0, 0);
        for (_, v) in self.counted().filter(|(_, v)| v.round == round) {
            all += 1;
            same += usize::from(v.parent == Some(parent));
        }
        (same, all)
    }

    /// The lineage `round`'s states are to be followed in: the parent most of the round's
    /// counted voters claim their states were merged on; when no parent has most of them
    /// (the swarm's lineages came apart: a peer reconciled a round too late, and merged on
    /// its own state), the parent the most voters claim, ties to the smallest hash. `None`
    /// when no vote of the round names a parent.
    pub fn ruling_lineage(&self, round: u64) -> Option<Lineage> {
        let mut lineages: FastMap<ContentHash, usize> = FastMap::default();
        let mut voters = 0;
        for (_, v) in self.counted().filter(|(_, v)| v.round == round) {
            voters += 1;
            if let Some(parent) = v.parent {
                *lineages.entry(parent).or_default() += 1;
            }
        }
        let (&parent, &kin) = lineages.iter().max_by_key(|(h, n)| (**n, std::cmp::Reverse(**h)))?;
        Some(Lineage { parent, majority: 2 * kin > voters })
    }
}
