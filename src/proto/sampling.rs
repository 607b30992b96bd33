//! Sampled contributions: in a swarm larger than the manifest's `contributors`, each peer
//! publishes a fragment's delta only every `period` rounds, in a slot fixed by its id, so a
//! round carries about `contributors` deltas whatever the swarm's size and every peer
//! fetches that many, not one per member (ARCHITECTURE.md, "Bandwidth: sampled
//! contributions").
//!
//! A peer outside its slot still answers the round's snapshot: its delta goes into its
//! error-feedback residual, so the work is sent, whole, in its next slot. A delta then
//! holds `period` rounds of work, and the merge scales the round's combined delta by
//! `1 / period`: over time the anchor moves by the swarm's mean per-round delta, as it does
//! when every peer contributes every round.
//!
//! The period is part of the replicated state ([`Sampling`]), re-estimated after every
//! merge from how many contributions it took, so every peer holding the same state uses the
//! same period and checks the same slots. All arithmetic is on integers.

use super::PeerId;

/// Longest contribution period: a swarm of 2²⁰ peers sampled down to 16 a round would need
/// 65,536; past this the rounds simply carry more deltas.
pub const MAX_PERIOD: u32 = 1 << 16;

/// The sampling part of a fragment's replicated state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampling {
    /// Estimated contributing peers (a moving average of merged deltas × period); 0 before
    /// the first merge that estimated it.
    pub swarm: u32,
    /// Rounds between two contributions of one peer to this fragment (1: every round).
    pub period: u32,
    /// The period before the latest merge: a delta made for a round just before the
    /// period changed is still in its author's slot.
    pub prev_period: u32,
}

impl Default for Sampling {
    /// Every peer every round: the state of a run without sampling, and of every run
    /// before its first merge.
    fn default() -> Self {
        Self { swarm: 0, period: 1, prev_period: 1 }
    }
}

impl Sampling {
    /// Whether this is the state of a run without sampling (its wire form is the older
    /// one, so states and their hashes are unchanged for such runs).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The estimate after a merge of `merged` contributions, for a target of
    /// `contributors` a round (0: no sampling, the state stays default).
    pub fn after_merge(self, merged: usize, contributors: usize) -> Self {
        if contributors == 0 {
            return Self::default();
        }
        // Each merged delta stands for the peers of its slot: `period` of them if it was
        // published under this period. A merge takes deltas published a round or more
        // earlier (merge lag, late arrivals), possibly under the previous, shorter period;
        // counting those at the new one would inflate the estimate, and the inflated
        // period would inflate the next (seen in the simulator: 1,000 peers estimated at
        // 16,000 after one round). The smaller of the two periods never overshoots.
        let published_under = self.period.min(self.prev_period);
        let sample = (merged as u64).saturating_mul(u64::from(published_under));
        let swarm = if self.swarm == 0 {
            sample
        } else {
            // Weight 1/4 on the new sample: one round with a few late or missing deltas
            // moves the period little.
            (3 * u64::from(self.swarm) + sample + 2) / 4
        };
        let swarm = swarm.min(u64::from(u32::MAX));
        let target = swarm.div_ceil(contributors as u64).clamp(1, u64::from(MAX_PERIOD));
        // The period moves only when the estimate is off by more than a quarter: every
        // change moves slots, and a delta published under a period two changes old is out
        // of its slot for receivers (its work is then merged only on its author's side
        // until it goes stale).
        let current = u64::from(self.period);
        let period =
            if 4 * target < 3 * current || 4 * target > 5 * current { target } else { current };
        Self { swarm: swarm as u32, period: period as u32, prev_period: self.period }
    }

    /// Whether `author` may contribute to `fragment` in `round`: always with period 1, else
    /// in the rounds where its slot comes up under the current or the previous period.
    pub fn in_slot(&self, author: PeerId, fragment: usize, round: u64) -> bool {
        [self.period, self.prev_period].into_iter().any(|k| turn(author, fragment, round, k))
    }

    /// Whether `me` publishes in `round` (its slot under the current period only).
    pub fn publishes(&self, me: PeerId, fragment: usize, round: u64) -> bool {
        turn(me, fragment, round, self.period)
    }

    /// The factor a merge applies to the round's combined delta.
    pub fn scale(&self) -> f32 {
        1.0 / self.period.max(1) as f32
    }
}

/// Whether `round` is `peer`'s turn for `fragment` under period `k`. The round may come
/// from the network (any u64): reduced before adding, so nothing overflows.
fn turn(peer: PeerId, fragment: usize, round: u64, k: u32) -> bool {
    let k = u64::from(k);
    k <= 1 || (slot(peer, fragment) % k + round % k) % k == 0
}

/// A peer's slot offset for a fragment: fixed, spread uniformly, and different per
/// fragment so one peer's contributions are spread over the rounds.
fn slot(peer: PeerId, fragment: usize) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(b"atoll/slot/v1");
    h.update(&peer.0.to_le_bytes());
    h.update(&(fragment as u64).to_le_bytes());
    let b = h.finalize();
    u64::from_le_bytes(b.as_bytes()[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_target_nothing_is_sampled() {
        let s = Sampling::default().after_merge(500, 0);
        assert!(s.is_default());
        assert!((0..10).all(|r| s.in_slot(PeerId(r), 0, r) && s.publishes(PeerId(r), 0, r)));
        assert_eq!(s.scale(), 1.0);
    }

    #[test]
    fn the_period_follows_the_swarm_and_settles() {
        // 1,000 peers, 16 wanted a round: the first merge takes all of them.
        let mut s = Sampling::default().after_merge(1000, 16);
        assert_eq!((s.swarm, s.period, s.prev_period), (1000, 63, 1));
        // Then each round merges the peers whose slot came up: about 1000 / 63.
        for _ in 0..40 {
            s = s.after_merge(1000 / s.period as usize, 16);
        }
        assert!((900..=1000).contains(&s.swarm), "{s:?}");
        assert!((60..=63).contains(&s.period), "{s:?}");
        // Four peers never sample.
        let small = Sampling::default().after_merge(4, 16).after_merge(4, 16);
        assert_eq!(small.period, 1);
    }

    #[test]
    fn every_peer_gets_one_slot_per_period_and_rounds_are_even() {
        let s = Sampling { swarm: 1000, period: 50, prev_period: 50 };
        let mut per_round = vec![0usize; 50];
        for id in 0..1000u64 {
            let slots: Vec<u64> = (100..150).filter(|&r| s.publishes(PeerId(id), 1, r)).collect();
            assert_eq!(slots.len(), 1, "peer {id}");
            per_round[(slots[0] - 100) as usize] += 1;
        }
        // 20 a round on average; a uniform hash keeps every round within a few of it.
        assert!(per_round.iter().all(|&n| (5..=40).contains(&n)), "{per_round:?}");
    }

    #[test]
    fn a_slot_under_the_previous_period_still_counts_for_receivers() {
        let before = Sampling { swarm: 300, period: 20, prev_period: 20 };
        let after = Sampling { swarm: 400, period: 25, prev_period: 20 };
        let round = (0..40).find(|&r| before.publishes(PeerId(9), 0, r)).unwrap();
        assert!(after.in_slot(PeerId(9), 0, round));
        // Outside both periods' slots: refused.
        let off = (0..100)
            .find(|&r| !before.publishes(PeerId(9), 0, r) && !after.publishes(PeerId(9), 0, r))
            .unwrap();
        assert!(!after.in_slot(PeerId(9), 0, off));
        // A round from the network near u64::MAX is a turn like any other, not an overflow.
        let far = (u64::MAX - 200..=u64::MAX).filter(|&r| after.in_slot(PeerId(9), 0, r)).count();
        assert!((8..=18).contains(&far), "{far} turns in 201 rounds");
    }
}
