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

use super::{PeerId, RawSettings};

/// Longest contribution period: a swarm of 2²⁰ peers sampled down to 16 a round would need
/// 65,536; past this the rounds simply carry more deltas.
pub const MAX_PERIOD: u32 = 1 << 16;

/// Most rounds of work one sampled delta carries: a peer banks the rounds just before its
/// slot, at most this many, and leaves the rest unsent. Work held longer reaches the anchor
/// so late that the step it allows is too small: in the simulator, 1,000 peers (period 63)
/// ended at loss 0.146 banking all 63 rounds, 0.0043 sending only the slot's round, and
/// 0.0012 / 0.0017 / 0.0025 / 0.0092 banking at most 16 / 8 / 4 / 32 (bench/RESULTS.md).
pub const MAX_BANKED_ROUNDS: u32 = 16;

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

/// Largest `expected_peers` (the estimate is a u32).
pub const MAX_EXPECTED_PEERS: usize = u32::MAX as usize;

impl Sampling {
    /// The sampling of a run's initial state: the period `expected_peers` gives at
    /// `contributors` a round, with no estimate yet (the first merge's measurement replaces
    /// it whole, so a wrong guess costs one merge, not a slow average); default when either
    /// is 0.
    pub fn initial(settings: &RawSettings) -> Self {
        let (expected, c) = (settings.expected_peers as u64, settings.contributors as u64);
        if expected == 0 || c == 0 {
            return Self::default();
        }
        let period = expected.div_ceil(c).clamp(1, u64::from(MAX_PERIOD)) as u32;
        Self { swarm: 0, period, prev_period: period }
    }

    /// Whether this is the state of a run without sampling (its wire form is the older
    /// one, so states and their hashes are unchanged for such runs).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The estimate after a merge of `on_time` contributions made for the merged round and
    /// `late` ones made for earlier rounds (merge lag counts as late), over `rounds` rounds (the rounds since the
    /// state's previous merge: a skipped round's deltas wait for the next merge), for a
    /// target of `contributors` a round (0: no sampling, the state stays default).
    pub fn after_merge(
        self,
        on_time: usize,
        late: usize,
        rounds: u64,
        contributors: usize,
    ) -> Self {
        if contributors == 0 {
            return Self::default();
        }
        // Each merged delta stands for the peers of its slot: `period` of them if it was
        // published under this state's period, as every delta made for this round was. A
        // late one may come from before the period changed: counting it at a longer new
        // period would inflate the estimate, and the inflated period the next (seen in the
        // simulator: 1,000 peers estimated at 16,000 after one round), so it counts at the
        // smaller of the two. (Counting every delta so dipped the other way: the round
        // after the first merge read 1,000 peers as 16.)
        let late_under = self.period.min(self.prev_period);
        let published = (on_time as u64)
            .saturating_mul(u64::from(self.period))
            .saturating_add((late as u64).saturating_mul(u64::from(late_under)));
        let rounds = rounds.max(1);
        let sample = published.saturating_add(rounds / 2) / rounds;
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
        // until it goes stale). Compared before rounding: rounded up, an estimate of 5
        // for a period of 2 at 2 wanted (2.5) read as 3 and the period flipped with every
        // late delta (seen on real processes).
        let current = u64::from(self.period);
        let c = contributors as u64;
        let off = 4 * swarm < 3 * c * current || 4 * swarm > 5 * c * current;
        let period = if off { target } else { current };
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

    /// Whether `me`'s work of `round` goes into its next delta: in the last
    /// [`Self::banked_rounds`] rounds up to and including its slot. Other rounds' work is
    /// not sent.
    pub fn banks(&self, me: PeerId, fragment: usize, round: u64) -> bool {
        let k = u64::from(self.period);
        if k <= 1 {
            return true;
        }
        let until_turn = (k - (slot(me, fragment) % k + round % k) % k) % k;
        until_turn < u64::from(self.banked_rounds())
    }

    /// Rounds of work one delta holds: the period, at most [`MAX_BANKED_ROUNDS`].
    pub fn banked_rounds(&self) -> u32 {
        self.period.clamp(1, MAX_BANKED_ROUNDS)
    }

    /// The factor a merge applies to the round's combined delta: each delta holds
    /// [`Self::banked_rounds`] rounds of work.
    pub fn scale(&self) -> f32 {
        1.0 / self.banked_rounds() as f32
    }

    /// The outer step a merge into this state takes, from the manifest's `outer_lr` and
    /// `momentum` (`lr`, `μ`).
    ///
    /// A sampled delta holds its author's last `period` rounds of work, so the merged update
    /// is a `k`-round moving average of the swarm's per-round deltas: work reaches the anchor
    /// up to `k − 1` rounds late. Delayed updates need a smaller step: unchanged, a swarm
    /// sampled at `k = 16` oscillated in the simulator where all-to-all converged
    /// (bench/RESULTS.md). Model one direction of the loss as a round moving each peer a
    /// fraction `a` of its way to the optimum (`a ≤ 1`: inner training does not overshoot);
    /// Nesterov on the moving average is then stable for every such `a` with no momentum
    /// and a learning rate up to about `5 / (k + 1)` (the linear system's spectral radius,
    /// computed for k = 2..63: bench/RESULTS.md), while any momentum shrinks that range
    /// (at `μ = 0.9`, `k = 4`, to `a < 0.2`). So past period 1 the step has no momentum and
    /// its gain `lr / (1 − μ)` is capped at `5 / (k + 1)`. Period 1 is the manifest's step
    /// exactly. Plain f32 arithmetic: every peer computes the same bits.
    pub fn outer(&self, settings: &RawSettings) -> Outer {
        let (lr, mu) = (settings.outer_lr, settings.momentum);
        if self.period <= 1 {
            return Outer { scale: 1.0, lr, mu };
        }
        let gain = lr / (1.0 - mu);
        let stable = 5.0 / (self.banked_rounds() as f32 + 1.0);
        Outer { scale: self.scale(), lr: gain.min(stable), mu: 0.0 }
    }
}

/// The outer step of one merge: the round's combined delta times `scale`, then Nesterov
/// with learning rate `lr` and momentum `mu`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outer {
    pub scale: f32,
    pub lr: f32,
    pub mu: f32,
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
    fn an_expected_size_sets_the_first_period_and_the_first_merge_replaces_it() {
        let raw = |expected, contributors| RawSettings {
            expected_peers: expected,
            contributors,
            ..RawSettings::default()
        };
        assert!(Sampling::initial(&raw(0, 16)).is_default());
        assert!(Sampling::initial(&raw(1000, 0)).is_default());
        assert!(Sampling::initial(&raw(10, 16)).is_default(), "fewer than wanted: period 1");
        let s = Sampling::initial(&raw(1000, 16));
        assert_eq!(s, Sampling { swarm: 0, period: 63, prev_period: 63 });
        assert_eq!(Sampling::initial(&raw(u32::MAX as usize, 1)).period, MAX_PERIOD);
        // Right: 16 deltas at period 63 measure ~1,000 and the period stays.
        let right = s.after_merge(16, 0, 1, 16);
        assert_eq!((right.swarm, right.period), (1008, 63));
        // Far off (100 peers, not 10,000): one merge after 39 empty rounds corrects it.
        let wrong = Sampling::initial(&raw(10_000, 16));
        assert_eq!(wrong.period, 625);
        let fixed = wrong.after_merge(6, 0, 40, 16);
        assert_eq!((fixed.swarm, fixed.period), (94, 6));
    }

    #[test]
    fn without_a_target_nothing_is_sampled() {
        let s = Sampling::default().after_merge(500, 0, 1, 0);
        assert!(s.is_default());
        assert!((0..10).all(|r| s.in_slot(PeerId(r), 0, r) && s.publishes(PeerId(r), 0, r)));
        assert_eq!(s.scale(), 1.0);
    }

    #[test]
    fn the_period_follows_the_swarm_and_settles() {
        // 1,000 peers, 16 wanted a round: the first merge takes all of them.
        let mut s = Sampling::default().after_merge(1000, 0, 1, 16);
        assert_eq!((s.swarm, s.period, s.prev_period), (1000, 63, 1));
        // Then each round merges the peers whose slot came up: about 1000 / 63.
        for _ in 0..40 {
            s = s.after_merge(1000 / s.period as usize, 0, 1, 16);
        }
        // The first merge after the change counts its deltas at the old period (1), so the
        // estimate dips and the period settles at 48, within the quarter it tolerates
        // (1,000 / 16 = 62.5): about 21 deltas a round instead of 16.
        assert!((900..=1000).contains(&s.swarm), "{s:?}");
        assert!((47..=63).contains(&s.period), "{s:?}");
        assert!(4 * s.swarm <= 5 * 16 * s.period && 4 * s.swarm >= 3 * 16 * s.period, "{s:?}");
        // Four peers never sample.
        let small = Sampling::default().after_merge(4, 0, 1, 16).after_merge(4, 0, 1, 16);
        assert_eq!(small.period, 1);
        // Four peers, two wanted: period 2. When a round is skipped the next merge takes
        // both rounds' deltas; counted per round the estimate stays at four (counted
        // whole, it read six or eight and the period went to 3 or 4: seen on real
        // processes).
        let mut s = Sampling::default().after_merge(4, 0, 1, 2);
        assert_eq!((s.swarm, s.period), (4, 2));
        for _ in 0..20 {
            s = s.after_merge(2, 0, 1, 2).after_merge(4, 0, 2, 2);
        }
        assert_eq!((s.swarm, s.period), (4, 2), "{s:?}");
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
    fn past_period_one_the_outer_step_drops_momentum_and_shrinks_with_the_period() {
        let raw = |outer_lr, momentum| RawSettings { outer_lr, momentum, ..Default::default() };
        let at = |period| Sampling { swarm: 100, period, prev_period: period };
        // Period 1: the manifest's step, bit for bit.
        assert_eq!(at(1).outer(&raw(0.7, 0.9)), Outer { scale: 1.0, lr: 0.7, mu: 0.9 });
        // Period 2: the gain 0.7 / 0.1 = 7 is capped at 5 / 3, without momentum.
        assert_eq!(at(2).outer(&raw(0.7, 0.9)), Outer { scale: 0.5, lr: 5.0 / 3.0, mu: 0.0 });
        // A small manifest step is kept: gain 0.2 / 0.5 = 0.4 is under the cap of period 4.
        let o = at(4).outer(&raw(0.2, 0.5));
        assert_eq!((o.scale, o.lr, o.mu), (0.25, 0.4, 0.0));
        // The step shrinks as the period grows and stays finite and positive; past
        // MAX_BANKED_ROUNDS a delta holds that many rounds, and the step stays.
        let mut last = f32::INFINITY;
        for k in [2, 3, 8, MAX_BANKED_ROUNDS] {
            let o = at(k).outer(&raw(0.7, 0.9));
            assert!(o.lr < last && o.lr > 0.0 && o.mu == 0.0, "{o:?}");
            last = o.lr;
        }
        let longest = at(MAX_BANKED_ROUNDS).outer(&raw(0.7, 0.9));
        assert!([63, 1000, MAX_PERIOD].into_iter().all(|k| at(k).outer(&raw(0.7, 0.9)) == longest));
    }

    /// One direction of the loss in which a round of inner training moves each peer a
    /// fraction `a` of its way to the optimum (0), merged as sampling merges it (in
    /// expectation): the mean of the last `k` rounds' deltas, then Nesterov. Returns |x| after `rounds` from x = 1.
    fn model(a: f32, k: usize, o: Outer, rounds: usize) -> f32 {
        let (mut x, mut m) = (1f32, 0f32);
        let mut past = std::collections::VecDeque::from(vec![0f32; k]);
        for _ in 0..rounds {
            past.pop_front();
            past.push_back(a * x);
            let u = past.iter().sum::<f32>() * o.scale;
            m = o.mu * m + u;
            x -= o.lr * (u + o.mu * m);
        }
        x.abs()
    }

    #[test]
    fn the_sampled_outer_step_converges_where_the_manifests_step_diverges() {
        let manifest = RawSettings { outer_lr: 0.7, momentum: 0.9, ..Default::default() };
        for k in [2u32, 4, 16, 63] {
            let s = Sampling { swarm: 16 * k, period: k, prev_period: k };
            let o = s.outer(&manifest);
            for a in [0.05f32, 0.2, 0.5, 1.0] {
                let left = model(a, s.banked_rounds() as usize, o, 3000);
                assert!(left < 1e-3, "period {k}, a = {a}: |x| = {left} ({o:?})");
            }
        }
        // The manifest's step on the same moving average (only scaled by 1/k) does not.
        let k = 16;
        let unchanged = Outer { scale: 1.0 / k as f32, lr: 0.7, mu: 0.9 };
        let left = model(0.5, k, unchanged, 3000);
        assert!(left.is_nan() || left >= 1.0, "{left}"); // it grows (to infinity, NaN past it)
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
