//! What the simulator records: bytes, waits, merges, and — when asked — each lineage's full
//! set of merged contributions, to check "never merged twice, never dropped" independently
//! of the protocol's own (bounded) log.

use crate::delta::ContentHash;
use crate::proto::{MergeReport, Offence};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// Bytes one peer moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bytes {
    /// Payloads (deltas, states) this peer uploaded to others.
    pub payload_sent: u64,
    pub payload_received: u64,
    /// Gossip messages this peer originated (counted once, as a mesh would carry them).
    pub gossip_sent: u64,
    pub gossip_received: u64,
}

/// Aggregates over the run.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub merges: u64,
    pub skipped: u64,
    pub adoptions: u64,
    /// State announcements the peers published (each counted once, not per receiver).
    pub state_announcements: u64,
    pub misbehaved: u64,
    /// Offences reported by honest peers, by kind.
    pub offences: BTreeMap<Offence, u64>,
    /// Longest wait from holding the quorum to merging (must stay within the grace cap).
    pub max_waited_ms: u64,
    /// Sum and count of grace windows in force, for the mean.
    pub grace_sum_ms: u64,
    /// Contributions merged (summed over peers).
    pub merged_contributions: u64,
    pub late_merged: u64,
    /// A lineage merged a contribution it already contained (must stay 0).
    pub double_merges: u64,
    /// Adoptions of a state whose lineage the simulator never saw produced (must stay 0).
    pub unknown_lineage: u64,
    /// States honest peers weighed before adopting them (`Output::Weigh`), and how many of
    /// those came out worse than the peer's own by more than `proto::WORSE_MARGIN`.
    pub weighed: u64,
    pub weighed_worse: u64,
    pub events: u64,
    /// Weight the honest peers' merges gave to contributions, summed over their merges:
    /// tokens × agreement factor, all authors (`merged_weight`) and hostile ones (and their
    /// Sybils: `hostile_weight`). Their ratio is the attackers' influence, measured directly
    /// rather than through a noisy loss.
    pub merged_weight: f64,
    pub hostile_weight: f64,
}

impl Stats {
    /// The hostile peers' share of the weight honest merges gave (0 with no merges).
    pub fn hostile_share(&self) -> f64 {
        if self.merged_weight > 0.0 {
            self.hostile_weight / self.merged_weight
        } else {
            0.0
        }
    }
}

/// Full merged sets per lineage (only when tracking is on).
#[derive(Debug, Default)]
pub struct Lineages {
    by_state: HashMap<ContentHash, Arc<HashSet<ContentHash>>>,
    /// `current[peer][fragment]`.
    pub current: Vec<Vec<Arc<HashSet<ContentHash>>>>,
    /// Every contribution published: hash → (peer, fragment, round).
    pub published: HashMap<ContentHash, (usize, usize, u64)>,
}

impl Lineages {
    pub fn new(peers: usize, initial_states: &[ContentHash]) -> Self {
        let empty = Arc::new(HashSet::new());
        let by_state = initial_states.iter().map(|h| (*h, empty.clone())).collect();
        let current = vec![vec![empty; initial_states.len()]; peers];
        Self { by_state, current, published: HashMap::new() }
    }

    pub fn merged(&mut self, peer: usize, r: &MergeReport, stats: &mut Stats) {
        let mut set = (*self.current[peer][r.fragment]).clone();
        for h in &r.merged {
            if !set.insert(*h) {
                stats.double_merges += 1;
            }
        }
        let set = Arc::new(set);
        self.by_state.insert(r.state_hash, set.clone());
        self.current[peer][r.fragment] = set;
    }

    pub fn adopted(&mut self, peer: usize, fragment: usize, hash: ContentHash, stats: &mut Stats) {
        match self.by_state.get(&hash) {
            Some(set) => self.current[peer][fragment] = set.clone(),
            None => stats.unknown_lineage += 1,
        }
    }

    /// A restarted peer resumes the lineage of its checkpointed state.
    pub fn restored(&mut self, peer: usize, fragment: usize, hash: ContentHash, stats: &mut Stats) {
        self.adopted(peer, fragment, hash, stats);
    }

    /// Contributions published for `fragment` in `rounds` that `peer`'s lineage lacks.
    pub fn missing(
        &self,
        peer: usize,
        fragment: usize,
        rounds: std::ops::RangeInclusive<u64>,
    ) -> usize {
        let set = &self.current[peer][fragment];
        self.published
            .iter()
            .filter(|(h, (_, f, r))| *f == fragment && rounds.contains(r) && !set.contains(*h))
            .count()
    }
}
