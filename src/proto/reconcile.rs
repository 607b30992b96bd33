//! Who holds which state: the votes behind reconciliation (DESIGN.md §3.2).
//!
//! After each merge every peer announces its state hash. When peers disagree, the state
//! held by the most recently heard peers wins; between states with as many holders, the
//! one merged from more contributions, then the smallest hash, so every peer that heard
//! the same announcements picks the same winner without talking further. Only each peer's
//! latest announcement counts, so a peer that moved on is not counted twice.
//!
//! The count decides where every peer holds a state of its own (a fragment's first rounds
//! at merge lag 0, when each closed on whatever had arrived): the widest merge is the one
//! a minority's deltas weigh least in, where the smallest hash could have been a set of
//! three that two colluders dominated. Holders claim the count in their announcements;
//! the state's log bears it ([`super::FragmentState::took`]), so a claim is checked when
//! the state arrives and a holder that claimed more than its state took loses its vote
//! ([`Votes::misclaimed`]).
//!
//! A vote is only as good as its voter: gossip keys cost nothing, so a flood of fresh
//! identities could otherwise outvote the swarm or make a peer believe it is behind. Only
//! *credited* voters count — peers whose deltas this peer fetched, decoded and accepted
//! (verified work), and this peer itself. Votes of others are kept (bounded)
//! and count as soon as their voter is credited. A voter caught vouching for a forged
//! state (src/proto/evidence.rs) loses its credit for good.
//!
//! Credit is earned again and again or it lapses: a voter counts while its latest credited
//! round is within [`Votes::lapse`] rounds of the newest credit anyone earned here. One
//! agreeing copy of honest work no longer buys a vote for the rest of the run; an identity
//! must keep contributing work that goes its rounds' way. The reference is the newest
//! credit, not the clock: in a swarm that stopped training nobody earns credit, so nobody's
//! lapses and its peers still reconcile; after a partition heals, each side's credits are
//! as recent as its rounds. A lapsed credit also makes room when the map is full.

use super::fasthash::{FastMap, FastSet};
use super::PeerId;
use crate::delta::ContentHash;
use std::collections::BTreeMap;

/// The latest state announcement of each peer, for one fragment.
#[derive(Debug, Clone)]
pub struct Votes {
    me: PeerId,
    latest: FastMap<PeerId, (u64, ContentHash)>,
    /// How many contributions each voter claims its latest state's merge took (only for
    /// votes that came as state announcements).
    claims: FastMap<PeerId, u32>,
    /// Voters with verified work: the round of their latest accepted contribution.
    credits: FastMap<PeerId, u64>,
    /// Most peers remembered (in each map); fake identities cannot grow memory past it.
    capacity: usize,
    /// Highest round of a counted vote (O(1) "am I behind?" checks on every message).
    max_round: u64,
    /// Voters that vouched for a forged state: never credited again (bounded).
    discredited: FastSet<PeerId>,
    /// The newest round anyone was credited for.
    newest_credit: u64,
    /// Rounds a credit lasts behind the newest one.
    lapse: u64,
}

/// Rounds a credit lasts behind the newest credit, at period 1: long enough for a peer that
/// contributes every few rounds (a slow one, or one whose deltas a few rounds disagreed),
/// short against a run (the default demo merges over 120 rounds per fragment).
pub const CREDIT_LAPSE: u64 = 64;

/// The winning state of a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    pub round: u64,
    pub hash: ContentHash,
    /// Peers holding it, in id order (sources to fetch it from).
    pub holders: Vec<PeerId>,
    /// Peers that announced any state for this round.
    pub voters: usize,
}

impl Votes {
    pub fn new(me: PeerId, capacity: usize) -> Self {
        Self {
            me,
            latest: FastMap::default(),
            claims: FastMap::default(),
            credits: FastMap::default(),
            capacity,
            max_round: 0,
            discredited: FastSet::default(),
            newest_credit: 0,
            lapse: CREDIT_LAPSE,
        }
    }

    /// Most credits (and voters' recipes) kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether `peer`'s votes count: others' while their credit is current. Ours too,
    /// unless this peer once earned credit and let it lapse (it stopped contributing, or
    /// its work stopped going the rounds' way): then the others no longer count it either,
    /// and a state only it holds would be a lineage nobody follows — it follows theirs
    /// instead. A peer that never contributed (a joiner, an observer) keeps its own vote.
    pub fn counts(&self, peer: &PeerId) -> bool {
        match self.credits.get(peer) {
            Some(&r) => self.current(r),
            None => *peer == self.me,
        }
    }

    /// Whether a credit earned for `round` still counts.
    fn current(&self, round: u64) -> bool {
        round.saturating_add(self.lapse) >= self.newest_credit
    }

    /// Peers other than this one whose credit is current: those it saw contribute lately.
    pub fn credited(&self) -> usize {
        self.credits.iter().filter(|(p, r)| **p != self.me && self.current(**r)).count()
    }

    /// Rounds a credit lasts behind the newest: [`CREDIT_LAPSE`] plus four periods (a
    /// sampled peer contributes once per `period` rounds).
    pub fn lapse(&self) -> u64 {
        self.lapse
    }

    /// `peer` made a contribution for `round` that this peer verified and accepted.
    pub fn credit(&mut self, peer: PeerId, round: u64) {
        if self.discredited.contains(&peer) {
            return;
        }
        self.newest_credit = self.newest_credit.max(round);
        if self.credits.len() >= self.capacity && !self.credits.contains_key(&peer) {
            // Full: the stalest credit makes room if it has lapsed (ties: the smallest id,
            // so every peer evicts alike), else the newcomer waits.
            let stalest = self.credits.iter().map(|(p, r)| (*r, *p)).min();
            match stalest {
                Some((r, p)) if !self.current(r) => {
                    self.credits.remove(&p);
                }
                _ => return,
            }
        }
        let r = self.credits.entry(peer).or_insert(round);
        *r = (*r).max(round);
        if let Some((r, _)) = self.latest.get(&peer) {
            self.max_round = self.max_round.max(*r);
        }
    }

    /// Our own vote: the state we hold now, whatever its round (a follower may go back to
    /// an older state). Announcements of ours heard from the network go through
    /// [`Votes::record`], where an older one (a replay) changes nothing.
    pub fn set_mine(&mut self, round: u64, hash: ContentHash, took: u32) {
        self.latest.insert(self.me, (round, hash));
        self.claims.insert(self.me, took);
        if self.counts(&self.me) {
            self.max_round = self.max_round.max(round);
        }
    }

    /// Records `peer`'s announcement unless it is older than what we have from it.
    pub fn record(&mut self, peer: PeerId, round: u64, hash: ContentHash) {
        let full = self.latest.len() >= self.capacity;
        match self.latest.entry(peer) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                if e.get().0 > round {
                    return;
                }
                if *e.get() != (round, hash) {
                    self.claims.remove(&peer);
                }
                e.insert((round, hash));
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                if full {
                    return;
                }
                e.insert((round, hash));
            }
        }
        if self.counts(&peer) {
            self.max_round = self.max_round.max(round);
        }
    }

    /// Notes that `peer` claims its state `hash` of `round` took `took` contributions (if
    /// that is still its latest vote).
    pub fn claim(&mut self, peer: PeerId, round: u64, hash: ContentHash, took: u32) {
        if self.latest.get(&peer) == Some(&(round, hash)) {
            self.claims.insert(peer, took);
        }
    }

    /// The counted holders of `hash` for `round` other than this peer (its claim is its
    /// state's) that claimed another count than `took`, the one the state's log bears: they
    /// announced a state they do not hold, or lied about it to win a tie.
    pub fn misclaimed(&self, round: u64, hash: ContentHash, took: u32) -> Vec<PeerId> {
        let mut h = self.holders(round, hash);
        h.retain(|p| *p != self.me && self.claims.get(p).is_some_and(|&c| c != took));
        h
    }

    /// `peer` vouched for a forged state: its votes stop counting, for good.
    pub fn discredit(&mut self, peer: PeerId) {
        if peer == self.me {
            return;
        }
        self.credits.remove(&peer);
        if self.discredited.len() < self.capacity {
            self.discredited.insert(peer);
        }
        self.max_round = self.counted().map(|(_, (r, _))| *r).max().unwrap_or(0);
    }

    /// The counted voters holding `hash` for `round`.
    pub fn holders(&self, round: u64, hash: ContentHash) -> Vec<PeerId> {
        let mut h: Vec<PeerId> =
            self.counted().filter(|(_, v)| **v == (round, hash)).map(|(p, _)| *p).collect();
        h.sort_unstable();
        h
    }

    /// Whether `hash` wins `round` with at least half of the round's counted voters (ties
    /// at exactly half go to the smallest hash, as in [`Votes::leader`]): what adopting a
    /// state nobody can recompute asks for, instead of a mere plurality.
    pub fn backed(&self, round: u64, hash: ContentHash) -> bool {
        self.leader(round).is_some_and(|l| l.hash == hash && 2 * l.holders.len() >= l.voters)
    }

    /// Highest round anyone announced (0 if none).
    pub fn max_round(&self) -> u64 {
        self.max_round
    }

    /// Forgets peers whose latest announcement is more than `keep` rounds older than the
    /// newest counted one (gone or stuck), and sets how long a credit lasts for a fragment
    /// contributed to once per `period` rounds. Measured from the newest counted
    /// announcement, not the clock's `round`: once the swarm stops merging (the end of a
    /// run) the last round's votes stay, so peers still reconcile. With no counted vote
    /// yet (a joiner), from the clock's: uncounted votes do not pile up.
    pub fn prune(&mut self, round: u64, keep: u64, period: u32) {
        let newest = match self.max_round {
            0 => round,
            counted => round.min(counted),
        };
        let oldest = newest.saturating_sub(keep);
        self.lapse = CREDIT_LAPSE.saturating_add(4 * u64::from(period));
        self.latest.retain(|_, (r, _)| *r >= oldest);
        self.claims.retain(|p, _| self.latest.contains_key(p));
        self.max_round = self.counted().map(|(_, (r, _))| *r).max().unwrap_or(0);
    }

    /// The votes that count.
    fn counted(&self) -> impl Iterator<Item = (&PeerId, &(u64, ContentHash))> {
        self.latest.iter().filter(|(p, _)| self.counts(p))
    }

    /// The most recent round that a counted voter announced, up to `max_round`.
    pub fn latest_round(&self, max_round: u64) -> Option<u64> {
        self.counted().map(|(_, (r, _))| *r).filter(|&r| r <= max_round).max()
    }

    /// The state most peers hold for `round` (ties: the one whose holders claim it took
    /// more contributions — the least any of them claims — then the smallest hash).
    pub fn leader(&self, round: u64) -> Option<Leader> {
        let mut tally: BTreeMap<ContentHash, (Vec<PeerId>, Option<u32>)> = BTreeMap::new();
        let mut voters = 0;
        for (peer, (r, h)) in self.counted() {
            if *r == round {
                let (holders, took) = tally.entry(*h).or_default();
                holders.push(*peer);
                if let Some(&c) = self.claims.get(peer) {
                    *took = Some(took.map_or(c, |t| t.min(c)));
                }
                voters += 1;
            }
        }
        // BTreeMap iterates hashes in ascending order; `max_by_key` keeps the last maximum,
        // so iterate in reverse to make the smallest hash win ties.
        let (hash, (mut holders, _)) =
            tally.into_iter().rev().max_by_key(|(_, (p, took))| (p.len(), took.unwrap_or(0)))?;
        holders.sort_unstable();
        Some(Leader { round, hash, holders, voters })
    }

    /// Fraction of the peers that announced `round` holding `hash` (1 when nobody did).
    pub fn agreement(&self, round: u64, hash: ContentHash) -> f64 {
        let (mut same, mut all) = (0usize, 0usize);
        for (_, (r, h)) in self.counted() {
            if *r == round {
                all += 1;
                same += usize::from(*h == hash);
            }
        }
        if all == 0 {
            1.0
        } else {
            same as f64 / all as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majority_then_smallest_hash_wins() {
        let (a, b) = (ContentHash([1; 32]), ContentHash([2; 32]));
        let mut v = Votes::new(PeerId(0), 10);
        (1..=3).for_each(|p| v.credit(PeerId(p), 5));
        v.record(PeerId(1), 5, b);
        v.record(PeerId(2), 5, a);
        assert_eq!(v.leader(5).unwrap().hash, a);
        v.record(PeerId(3), 5, b);
        let l = v.leader(5).unwrap();
        assert_eq!((l.hash, l.holders.clone(), l.voters), (b, vec![PeerId(1), PeerId(3)], 3));
        // A newer announcement replaces an older one; an older one is ignored.
        v.record(PeerId(3), 6, a);
        v.record(PeerId(3), 4, b);
        assert_eq!(v.leader(5).unwrap().hash, a);
        assert_eq!(v.latest_round(100), Some(6));
        assert_eq!(v.latest_round(5), Some(5));
        v.prune(6, 0, 1);
        assert!(v.leader(5).is_none());
    }

    /// Between states with as many holders, the one whose holders claim the wider merge
    /// wins (the least claim of its holders counts, so a liar cannot raise an honest
    /// state's), then the smallest hash; a holder whose claim the state's log does not
    /// bear out is named, and a vote that came without a claim is never named.
    #[test]
    fn a_tie_goes_to_the_wider_merge_and_a_false_claim_is_named() {
        let (a, b, c) = (ContentHash([1; 32]), ContentHash([2; 32]), ContentHash([3; 32]));
        let mut v = Votes::new(PeerId(0), 10);
        (1..=5).for_each(|p| v.credit(PeerId(p), 5));
        v.set_mine(5, a, 3);
        v.record(PeerId(1), 5, b);
        v.claim(PeerId(1), 5, b, 9);
        v.record(PeerId(2), 5, c);
        assert_eq!(v.leader(5).unwrap().hash, b, "9 contributions beat 3 and none");
        v.record(PeerId(3), 5, c);
        assert_eq!(v.leader(5).unwrap().hash, c, "two holders beat a wider merge");
        v.record(PeerId(4), 5, a);
        v.claim(PeerId(4), 5, a, 12);
        v.claim(PeerId(2), 5, c, 5);
        assert_eq!(v.leader(5).unwrap().hash, c, "a holder's larger claim raised mine");
        v.claim(PeerId(2), 5, c, 2);
        assert_eq!(v.leader(5).unwrap().hash, a, "3 beats 2 at two holders each");
        assert_eq!(v.misclaimed(5, a, 3), vec![PeerId(4)], "this peer's own claim is not checked");
        assert_eq!(v.misclaimed(5, a, 12), vec![]);
        assert_eq!(v.misclaimed(5, c, 2), vec![], "peer 3's vote claimed nothing");
        // A new vote drops the claim made for the old one; a claim for another vote than
        // the latest is not kept.
        v.record(PeerId(1), 6, b);
        v.claim(PeerId(1), 6, b, 4);
        assert_eq!(v.misclaimed(6, b, 0), vec![PeerId(1)]);
        v.record(PeerId(1), 6, c);
        v.claim(PeerId(1), 6, b, 4);
        assert_eq!(v.misclaimed(6, c, 0), vec![]);
    }

    #[test]
    fn capacity_bounds_memory() {
        let mut v = Votes::new(PeerId(0), 2);
        for i in 0..10 {
            v.credit(PeerId(i), 1);
            v.record(PeerId(i), 1, ContentHash([0; 32]));
        }
        assert_eq!(v.leader(1).unwrap().voters, 2);
    }

    /// Credit is earned again or it lapses: a voter credited once and never again stops
    /// counting once others have earned credit `lapse` rounds newer; earning again
    /// restores it. Where nobody earns (a stopped swarm), nobody lapses.
    #[test]
    fn a_credit_not_earned_again_lapses() {
        let a = ContentHash([1; 32]);
        let mut v = Votes::new(PeerId(0), 100);
        v.prune(0, 0, 1);
        let lapse = v.lapse();
        assert_eq!(lapse, CREDIT_LAPSE + 4);
        v.credit(PeerId(1), 3);
        v.credit(PeerId(2), 3);
        // Rounds go by with votes and no new credit: both still count.
        v.record(PeerId(1), 3 + 10 * lapse, a);
        v.record(PeerId(2), 3 + 10 * lapse, a);
        assert_eq!(v.leader(3 + 10 * lapse).unwrap().voters, 2, "a stopped swarm lapsed");
        // Peer 2 keeps contributing; peer 1 does not.
        v.credit(PeerId(2), 3 + lapse);
        assert!(v.counts(&PeerId(1)), "lapse rounds behind the newest: still current");
        v.credit(PeerId(2), 4 + lapse);
        assert!(!v.counts(&PeerId(1)) && v.counts(&PeerId(2)));
        assert_eq!(v.leader(3 + 10 * lapse).unwrap().holders, vec![PeerId(2)]);
        // Work again, a vote again.
        v.credit(PeerId(1), 5 + lapse);
        assert!(v.counts(&PeerId(1)));
        // A longer period lengthens the lapse: a sampled peer contributes once a period.
        v.prune(0, 0, 16);
        assert_eq!(v.lapse(), CREDIT_LAPSE + 64);
    }

    /// A full map of lapsed credits (Sybils that earned once and went idle) makes room
    /// for a peer that works now; a full map of current credits does not.
    #[test]
    fn lapsed_credits_make_room_for_new_work() {
        let mut v = Votes::new(PeerId(0), 4);
        for i in 10..14 {
            v.credit(PeerId(i), 1);
        }
        v.credit(PeerId(20), 2);
        assert!(!v.counts(&PeerId(20)), "full of current credits: the newcomer waits");
        let late = 2 + v.lapse();
        v.credit(PeerId(21), late);
        assert!(v.counts(&PeerId(21)), "a lapsed credit made room");
        assert_eq!(v.credits.len(), 4);
        // The one evicted is the stalest, smallest id first: every peer evicts alike.
        assert!(!v.credits.contains_key(&PeerId(10)));
    }

    /// Votes are forgotten by their distance from the newest counted one: while nobody
    /// merges (the end of a run) the clock moving on forgets nothing.
    #[test]
    fn an_idle_swarm_keeps_its_last_votes() {
        let (a, b) = (ContentHash([1; 32]), ContentHash([2; 32]));
        let mut v = Votes::new(PeerId(0), 100);
        v.credit(PeerId(1), 10);
        v.record(PeerId(0), 10, a);
        v.record(PeerId(1), 10, b);
        v.prune(40, 3, 1);
        assert_eq!(v.leader(10).unwrap().voters, 2, "the clock alone forgot the last votes");
        v.record(PeerId(1), 40, b);
        v.prune(40, 3, 1);
        assert_eq!(v.leader(10), None);
        assert_eq!(v.latest_round(40), Some(40));
        // Without a counted vote, the clock decides: uncounted votes do not pile up.
        let mut w = Votes::new(PeerId(0), 100);
        w.record(PeerId(5), 10, a);
        w.prune(40, 3, 1);
        w.credit(PeerId(5), 10);
        assert_eq!(w.leader(10), None);
    }

    /// Our own vote counts until we earned credit and let it lapse, as the others see us;
    /// then we follow their state, and our vote is what we hold now, even an older round.
    #[test]
    fn our_own_vote_lapses_with_our_credit() {
        let (a, b) = (ContentHash([1; 32]), ContentHash([2; 32]));
        let me = PeerId(0);
        let mut v = Votes::new(me, 100);
        v.prune(0, 0, 1);
        v.record(me, 9, a);
        assert!(v.counts(&me), "a peer that never contributed keeps its vote");
        v.credit(me, 3);
        v.credit(PeerId(1), 3);
        v.record(PeerId(1), 8, b);
        assert_eq!(v.leader(9).unwrap().hash, a);
        // Peer 1 goes on earning credit; we stopped contributing at round 3.
        v.credit(PeerId(1), 4 + v.lapse());
        assert!(!v.counts(&me) && v.counts(&PeerId(1)));
        assert_eq!(v.leader(9), None, "a lapsed peer's own state leads nobody");
        assert_eq!(v.latest_round(100), Some(8));
        // A replay of an older announcement of ours changes nothing; going back to the
        // swarm's older state replaces our newer vote.
        v.record(me, 8, b);
        assert_eq!(v.latest[&me], (9, a));
        v.set_mine(8, b, 0);
        v.credit(me, 4 + v.lapse());
        assert_eq!(v.leader(8).unwrap().holders, vec![me, PeerId(1)]);
    }

    #[test]
    fn only_credited_voters_count() {
        let (a, b) = (ContentHash([1; 32]), ContentHash([2; 32]));
        let mut v = Votes::new(PeerId(0), 100);
        v.record(PeerId(0), 5, a);
        // Fifty fresh identities vote for a later round and another state: nothing moves.
        for i in 100..150 {
            v.record(PeerId(i), 9, b);
        }
        assert_eq!(v.max_round(), 5);
        assert_eq!(v.leader(9), None);
        assert_eq!(v.leader(5).unwrap().hash, a);
        // Verified work credits a voter, and its standing vote counts at once.
        v.credit(PeerId(100), 8);
        assert_eq!(v.max_round(), 9);
        assert_eq!(v.leader(9).unwrap().holders, vec![PeerId(100)]);
        // Pruning forgets old votes, not credits.
        v.prune(0, 0, 1);
        assert_eq!(v.max_round(), 9);
    }
}
