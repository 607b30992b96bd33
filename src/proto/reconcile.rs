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

/// The latest state announcement of each peer, for one fragment.
#[derive(Debug, Clone)]
pub struct Votes {
    me: PeerId,
    /// Each voter's latest vote. Every question about the votes walks this map, so an
    /// entry carries what the walk asks of its voter (its claim, a copy of its credit)
    /// instead of a lookup in another map per voter.
    latest: FastMap<PeerId, Vote>,
    /// Voters with verified work: the round of their latest accepted contribution
    /// (mirrored in `latest`'s entries).
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

/// A voter's latest vote, with what the tallies read of its voter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Vote {
    round: u64,
    hash: ContentHash,
    /// How many contributions the voter claims the state's merge took (only for votes that
    /// came as state announcements).
    claim: Option<u32>,
    /// The state the voter claims its state was merged on (only for votes that came as
    /// state announcements).
    parent: Option<ContentHash>,
    /// The voter's entry in [`Votes::credits`], kept equal to it.
    credit: Option<u64>,
}

impl Vote {
    fn is(&self, round: u64, hash: ContentHash) -> bool {
        self.round == round && self.hash == hash
    }
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
        self.counts_with(peer, self.credits.get(peer).copied())
    }

    /// [`Votes::counts`] for a voter whose credit is `credit`.
    fn counts_with(&self, peer: &PeerId, credit: Option<u64>) -> bool {
        match credit {
            Some(r) => self.current(r),
            None => *peer == self.me,
        }
    }

    /// Whether a contribution of `peer` makes a round's set wider: this peer's own, or a
    /// peer's whose votes count.
    pub fn vouches(&self, peer: &PeerId) -> bool {
        *peer == self.me || self.counts(peer)
    }

    /// Whether a credit earned for `round` still counts.
    fn current(&self, round: u64) -> bool {
        round.saturating_add(self.lapse) >= self.newest_credit
    }

    /// Peers other than this one whose credit is current: those it saw contribute lately.
    pub fn credited(&self) -> usize {
        self.credits.iter().filter(|(p, r)| **p != self.me && self.current(**r)).count()
    }

    /// This peer and the others whose credit is current, for which `due` holds (whose turn
    /// it is to contribute, in a sampled swarm).
    pub fn credited_where(&self, mut due: impl FnMut(PeerId) -> bool) -> usize {
        let others = self.credits.iter().filter(|(p, r)| **p != self.me && self.current(**r));
        others.filter(|(p, _)| due(**p)).count() + usize::from(due(self.me))
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
                    if let Some(v) = self.latest.get_mut(&p) {
                        v.credit = None;
                    }
                }
                _ => return,
            }
        }
        let r = self.credits.entry(peer).or_insert(round);
        *r = (*r).max(round);
        let credit = Some(*r);
        if let Some(v) = self.latest.get_mut(&peer) {
            v.credit = credit;
            self.max_round = self.max_round.max(v.round);
        }
    }

    /// Our own vote: the state we hold now, whatever its round (a follower may go back to
    /// an older state). Announcements of ours heard from the network go through
    /// [`Votes::record`], where an older one (a replay) changes nothing.
    pub fn set_mine(&mut self, round: u64, hash: ContentHash, took: u32, parent: ContentHash) {
        let credit = self.credits.get(&self.me).copied();
        let vote = Vote { round, hash, claim: Some(took), parent: Some(parent), credit };
        self.latest.insert(self.me, vote);
        if self.counts(&self.me) {
            self.max_round = self.max_round.max(round);
        }
    }

    /// Records `peer`'s announcement unless it is older than what we have from it.
    pub fn record(&mut self, peer: PeerId, round: u64, hash: ContentHash) {
        let full = self.latest.len() >= self.capacity;
        match self.latest.entry(peer) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                let v = e.get_mut();
                if v.round > round {
                    return;
                }
                if !v.is(round, hash) {
                    *v = Vote { round, hash, claim: None, parent: None, credit: v.credit };
                }
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                if full {
                    return;
                }
                let credit = self.credits.get(&peer).copied();
                e.insert(Vote { round, hash, claim: None, parent: None, credit });
            }
        }
        if self.counts(&peer) {
            self.max_round = self.max_round.max(round);
        }
    }

    /// Notes what `peer` claims of its state `hash` of `round` (if that is still its latest
    /// vote): how many contributions its merge took, and the state it was merged on.
    pub fn claim(
        &mut self,
        peer: PeerId,
        round: u64,
        hash: ContentHash,
        took: Option<u32>,
        parent: Option<ContentHash>,
    ) {
        if let Some(v) = self.latest.get_mut(&peer).filter(|v| v.is(round, hash)) {
            v.claim = took.or(v.claim);
            v.parent = parent.or(v.parent);
        }
    }

    /// The counted holders of `hash` for `round` other than this peer (its claim is its
    /// state's) that claimed another count than `took`, the one the state's log bears: they
    /// announced a state they do not hold, or lied about it to win a tie.
    pub fn misclaimed(&self, round: u64, hash: ContentHash, took: u32) -> Vec<PeerId> {
        let mut h = self.holders(round, hash);
        let claim = |p: &PeerId| self.latest.get(p).and_then(|v| v.claim);
        h.retain(|p| *p != self.me && claim(p).is_some_and(|c| c != took));
        h
    }

    /// `peer` vouched for a forged state: its votes stop counting, for good.
    pub fn discredit(&mut self, peer: PeerId) {
        if peer == self.me {
            return;
        }
        self.credits.remove(&peer);
        if let Some(v) = self.latest.get_mut(&peer) {
            v.credit = None;
        }
        if self.discredited.len() < self.capacity {
            self.discredited.insert(peer);
        }
        self.max_round = self.counted().map(|(_, v)| v.round).max().unwrap_or(0);
    }

    /// The counted voters holding `hash` for `round`.
    pub fn holders(&self, round: u64, hash: ContentHash) -> Vec<PeerId> {
        let mut h: Vec<PeerId> =
            self.counted().filter(|(_, v)| v.is(round, hash)).map(|(p, _)| *p).collect();
        h.sort_unstable();
        h
    }

    /// Whether `hash` wins `round` with at least half of the round's counted voters (ties
    /// at exactly half go to the smallest hash, as in [`Votes::leader`]): what adopting a
    /// state nobody can recompute asks for, instead of a mere plurality.
    pub fn backed(&self, round: u64, hash: ContentHash) -> bool {
        self.leader(round).is_some_and(|l| l.hash == hash && 2 * l.holders.len() >= l.voters)
    }

    /// Whether more than half of every counted voter (of any round: a credited peer whose
    /// vote for `round` is not in yet counts against) holds `hash` for `round`: what a
    /// state whose check failed needs. Colluders vote the moment they merge, so a share of
    /// the round's voters can be theirs before the honest votes arrive.
    pub fn held_by_most(&self, round: u64, hash: ContentHash) -> bool {
        2 * self.holders(round, hash).len() > self.counted().count()
    }

    /// Whether more than half of every counted voter has voted for `round` (or later): the
    /// round's votes are in, not only the first ones (colluders vote the moment they merge).
    pub fn round_is_in(&self, round: u64) -> bool {
        let all = self.counted().count();
        2 * self.counted().filter(|(_, v)| v.round >= round).count() > all
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
        self.latest.retain(|_, v| v.round >= oldest);
        self.max_round = self.counted().map(|(_, v)| v.round).max().unwrap_or(0);
    }

    /// The votes that count.
    fn counted(&self) -> impl Iterator<Item = (&PeerId, &Vote)> {
        self.latest.iter().filter(|(p, v)| self.counts_with(p, v.credit))
    }

    /// The most recent round that a counted voter announced, up to `max_round`.
    pub fn latest_round(&self, max_round: u64) -> Option<u64> {
        self.counted().map(|(_, v)| v.round).filter(|&r| r <= max_round).max()
    }

    /// The state most peers hold for `round` (ties: the one whose holders claim it took
    /// more contributions — the least any of them claims — then the smallest hash).
    pub fn leader(&self, round: u64) -> Option<Leader> {
        self.pick(round, false, |_| false)
    }

    /// The state to follow for `round`: [`Votes::leader`] among the states of the lineage
    /// most of the round's counted voters claim (states merged on one parent), when one
    /// does, and among states `skip` does not rule out (refused here, or not to be chased
    /// yet). After a merge at lag 0 the votes of a swarm are spread one or two to a state,
    /// all of one lineage: a state of another lineage (a made-up one, two credited voters
    /// strong) would win a bare plurality, and the next best state leads once the first is
    /// refused instead of every peer staying on its own.
    pub fn leader_where(&self, round: u64, skip: impl Fn(&ContentHash) -> bool) -> Option<Leader> {
        self.pick(round, true, skip)
    }

    fn pick(
        &self,
        round: u64,
        by_lineage: bool,
        skip: impl Fn(&ContentHash) -> bool,
    ) -> Option<Leader> {
        /// A counted vote of the round: the state, its voter, the voter's claim and parent.
        type Ballot = (ContentHash, PeerId, Option<u32>, Option<ContentHash>);
        // The round's counted votes in (hash, voter) order: each state's holders are a run,
        // in id order.
        let mut votes: Vec<Ballot> = self
            .counted()
            .filter(|(_, v)| v.round == round)
            .map(|(p, v)| (v.hash, *p, v.claim, v.parent))
            .collect();
        let voters = votes.len();
        if by_lineage {
            if let Some(ruling) = self.ruling_lineage(round).filter(|l| l.majority) {
                votes.retain(|v| v.3 == Some(ruling.parent));
            }
        }
        votes.retain(|v| !skip(&v.0));
        votes.sort_unstable_by_key(|&(h, p, _, _)| (h, p));
        // The most holders, then the highest count the least claiming holder claims (0
        // without a claim); runs come in ascending hash order and only a strictly better
        // one replaces the best, so the smallest hash wins ties.
        let mut best: Option<(&[Ballot], (usize, u32))> = None;
        for run in votes.chunk_by(|a, b| a.0 == b.0) {
            let took = run.iter().filter_map(|v| v.2).min().unwrap_or(0);
            let key = (run.len(), took);
            if best.is_none_or(|(_, k)| key > k) {
                best = Some((run, key));
            }
        }
        let (run, _) = best?;
        let holders = run.iter().map(|v| v.1).collect();
        Some(Leader { round, hash: run[0].0, holders, voters })
    }

    /// Fraction of the peers that announced `round` holding `hash` (1 when nobody did).
    pub fn agreement(&self, round: u64, hash: ContentHash) -> f64 {
        let (mut same, mut all) = (0usize, 0usize);
        for (_, v) in self.counted() {
            if v.round == round {
                all += 1;
                same += usize::from(v.hash == hash);
            }
        }
        if all == 0 {
            1.0
        } else {
            same as f64 / all as f64
        }
    }
}

mod lineage;
#[cfg(test)]
mod tests;

pub use lineage::Lineage;
