//! One fragment's replicated state — anchor, Nesterov buffer, round and the log of which
//! contributions recent rounds merged — and its wire form (the payload peers fetch to
//! reconcile or catch up).
//!
//! The merged-id log travels with the state because "never merged twice, never dropped"
//! is a property of a lineage, not of a peer: a peer that adopts another's state must also
//! adopt what that state has already absorbed, and re-queue what it had merged itself but
//! the adopted lineage had not.
//!
//! A state also names its *parent*, the state its last merge started from: with the log's
//! last entry (the contributions of that merge) it is the evidence a peer holding the
//! parent and those deltas checks bit for bit before adopting it (src/proto/evidence.rs).
//!
//! Wire form v3 (little-endian): magic "ATST", u16 version, u32 fragment, u64 round,
//! parent hash (32 bytes), u32 numel, anchor f32×numel, momentum f32×numel, u32 log
//! length, then per entry u64 round, u32 count, hash×count (32 bytes each, sorted). v4
//! (written only by runs that sample contributions, `contributors > 0`) appends u32 swarm,
//! u32 period, u32 previous period ([`Sampling`]); a state without sampling is written as
//! v3, so runs without it keep their states and hashes. The state hash is blake3 of
//! exactly these bytes, so equal hashes mean equal anchors, momenta, parents, logs and
//! sampling.

use super::fasthash::FastSet;
use super::sampling::{Sampling, MAX_PERIOD};
use crate::cursor::{Cursor, Short};
use crate::delta::ContentHash;
use crate::fragment::FragmentSpec;
use std::collections::VecDeque;

const MAGIC: [u8; 4] = *b"ATST";
/// Version of the state wire format (of a state that samples contributions; one that does
/// not is written as [`STATE_WIRE_VERSION_UNSAMPLED`]).
pub const STATE_WIRE_VERSION: u16 = 4;
/// Version of the wire form of a state without sampling.
pub const STATE_WIRE_VERSION_UNSAMPLED: u16 = 3;
/// Most ids one log entry may hold on the wire (bounds allocation on decode).
pub const MAX_IDS_PER_ROUND: usize = 1 << 20;
/// Most log entries on the wire (max lateness is at most 64 rounds).
pub const MAX_LOG_ENTRIES: usize = 128;

/// The replicated state of one fragment.
#[derive(Debug, Clone, PartialEq)]
pub struct FragmentState {
    pub fragment: u32,
    /// The round whose merge produced this state (0: the initial anchor).
    pub round: u64,
    /// Hash of the state that merge started from (all zero for the initial state).
    pub parent: ContentHash,
    pub anchor: Vec<f32>,
    pub momentum: Vec<f32>,
    /// `(round, sorted hashes of the contributions merged in it)` for recent rounds, oldest
    /// first. Whole hashes: with 8-byte ids, two deltas an attacker ground to collide
    /// (~2^32 work) would make an honest state recompute as a forgery on a peer that holds
    /// the other one.
    pub log: VecDeque<(u64, Vec<ContentHash>)>,
    /// Every id in `log`, for O(1) lookups: "already merged?" is asked for every
    /// announcement and every payload, a million times a round in large simulations.
    index: FastSet<ContentHash>,
    /// Who contributes in which round (every peer in every round unless the run samples).
    pub sampling: Sampling,
}

/// Why a state payload was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    #[error("state payload truncated or malformed at byte {0}")]
    Malformed(usize),
    #[error("not a state payload")]
    BadMagic,
    #[error("unsupported state wire version {0}")]
    Version(u16),
    #[error("state is for fragment {got}, expected {want}")]
    WrongFragment { got: u32, want: usize },
    #[error("state has {got} values, expected {want}")]
    WrongLength { got: u32, want: usize },
    #[error("state holds a non-finite value")]
    NonFinite,
    #[error("state log exceeds its bounds")]
    LogTooLarge,
    #[error("state payload has trailing bytes")]
    Trailing,
}

impl FragmentState {
    /// The initial state: the run's initial anchor, zero momentum, round 0.
    pub fn initial(fragment: u32, anchor: Vec<f32>) -> Self {
        let momentum = vec![0.0; anchor.len()];
        Self {
            fragment,
            round: 0,
            parent: ContentHash([0; 32]),
            anchor,
            momentum,
            log: VecDeque::new(),
            index: FastSet::default(),
            sampling: Sampling::default(),
        }
    }

    /// Takes new anchor and momentum values and returns the state as it was: its values
    /// are moved out, not copied (a merge keeps its parent without copying 8 B/parameter).
    pub fn replace_values(&mut self, anchor: Vec<f32>, momentum: Vec<f32>) -> Self {
        Self {
            fragment: self.fragment,
            round: self.round,
            parent: self.parent,
            anchor: std::mem::replace(&mut self.anchor, anchor),
            momentum: std::mem::replace(&mut self.momentum, momentum),
            log: self.log.clone(),
            index: self.index.clone(),
            sampling: self.sampling,
        }
    }

    /// How many contributions the merge that made this state took (0 for the initial
    /// state): bound into the state by its hash, so what its holders claim for it in their
    /// announcements ([`super::StateAnnounce::took`]) is checked when it is fetched.
    pub fn took(&self) -> u32 {
        let last = self.log.back().filter(|(r, _)| *r == self.round && self.round > 0);
        let n = last.map_or(0, |(_, ids)| ids.len());
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Whether the contribution with this hash is in the log.
    pub fn has_merged(&self, hash: &ContentHash) -> bool {
        self.index.contains(hash)
    }

    /// Records a merge of `ids` in `round` (keeping `keep` rounds of log), `late` of them
    /// made for an earlier round (merge lag, late arrivals), and re-estimates the sampling for a target of
    /// `contributors` deltas a round (0: none). Every merge, made here or recomputed to
    /// check another's, goes through this.
    pub fn record_merge(
        &mut self,
        round: u64,
        ids: Vec<ContentHash>,
        late: usize,
        keep: u64,
        contributors: usize,
    ) {
        // A merge after skipped rounds takes their deltas too: it stands for the rounds
        // since the state's previous merge (at most the log's span, beyond which deltas
        // are too old to be merged). The first merge stands for one: the rounds before it
        // had nothing to merge (nobody had trained yet), not a skipped round's deltas.
        let rounds = match self.log.back() {
            Some((previous, _)) => round.saturating_sub(*previous).clamp(1, keep.max(1)),
            None => 1,
        };
        let on_time = ids.len().saturating_sub(late);
        self.sampling = self.sampling.after_merge(on_time, late, rounds, contributors);
        self.record(round, ids, keep);
    }

    /// Appends a round's ids and forgets rounds older than `keep` rounds before `round`.
    pub fn record(&mut self, round: u64, mut ids: Vec<ContentHash>, keep: u64) {
        ids.sort_unstable();
        ids.dedup();
        self.index.extend(ids.iter().copied());
        self.log.push_back((round, ids));
        let mut forgotten = Vec::new();
        while self.log.front().is_some_and(|(r, _)| r.saturating_add(keep) < round) {
            if let Some((_, old)) = self.log.pop_front() {
                forgotten.extend(old);
            }
        }
        // An id may be listed in a newer round too (an adopted log from a peer can hold
        // it twice): it stays merged while any kept round lists it.
        for id in forgotten {
            if !self.log.iter().any(|(_, ids)| ids.binary_search(&id).is_ok()) {
                self.index.remove(&id);
            }
        }
    }

    fn write(&self, sink: &mut impl Sink) {
        let sampled = !self.sampling.is_default();
        let version = if sampled { STATE_WIRE_VERSION } else { STATE_WIRE_VERSION_UNSAMPLED };
        sink.put(&MAGIC);
        sink.put(&version.to_le_bytes());
        sink.put(&self.fragment.to_le_bytes());
        sink.put(&self.round.to_le_bytes());
        sink.put(&self.parent.0);
        sink.put(&(self.anchor.len() as u32).to_le_bytes());
        sink.put_values(&self.anchor);
        sink.put_values(&self.momentum);
        sink.put(&(self.log.len() as u32).to_le_bytes());
        for (round, ids) in &self.log {
            sink.put(&round.to_le_bytes());
            sink.put(&(ids.len() as u32).to_le_bytes());
            for id in ids {
                sink.put(&id.0);
            }
        }
        if sampled {
            let Sampling { swarm, period, prev_period } = self.sampling;
            for v in [swarm, period, prev_period] {
                sink.put(&v.to_le_bytes());
            }
        }
    }

    /// The wire form.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + 8 * self.anchor.len());
        self.write(&mut out);
        out
    }

    /// blake3 of the wire form, computed without building it.
    pub fn hash(&self) -> ContentHash {
        let mut h = blake3::Hasher::new();
        self.write(&mut h);
        ContentHash(*h.finalize().as_bytes())
    }

    /// Size of the wire form.
    pub fn wire_len(&self) -> usize {
        58 + 8 * self.anchor.len()
            + self.log.iter().map(|(_, ids)| 12 + 32 * ids.len()).sum::<usize>()
            + if self.sampling.is_default() { 0 } else { 12 }
    }

    /// Parses and checks a state payload for `spec`. Never panics.
    pub fn from_bytes(bytes: &[u8], spec: &FragmentSpec) -> Result<Self, StateError> {
        let mut r = Cursor::new(bytes);
        if r.take(4)? != MAGIC {
            return Err(StateError::BadMagic);
        }
        let version = r.u16_le()?;
        if version != STATE_WIRE_VERSION && version != STATE_WIRE_VERSION_UNSAMPLED {
            return Err(StateError::Version(version));
        }
        let fragment = r.u32_le()?;
        if fragment as usize != spec.id {
            return Err(StateError::WrongFragment { got: fragment, want: spec.id });
        }
        let round = r.u64_le()?;
        let parent = ContentHash(r.array()?);
        let numel = r.u32_le()?;
        if numel as usize != spec.numel() {
            return Err(StateError::WrongLength { got: numel, want: spec.numel() });
        }
        // The length is known to match the spec, and `take` checks the bytes exist.
        let floats = |bytes: &[u8]| -> Result<Vec<f32>, StateError> {
            let v: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            if v.iter().any(|x| !x.is_finite()) {
                return Err(StateError::NonFinite);
            }
            Ok(v)
        };
        let anchor = floats(r.take(4 * numel as usize)?)?;
        let momentum = floats(r.take(4 * numel as usize)?)?;
        let entries = r.u32_le()? as usize;
        if entries > MAX_LOG_ENTRIES {
            return Err(StateError::LogTooLarge);
        }
        let mut log = VecDeque::with_capacity(entries);
        for _ in 0..entries {
            let round = r.u64_le()?;
            let count = r.u32_le()? as usize;
            if count > MAX_IDS_PER_ROUND {
                return Err(StateError::LogTooLarge);
            }
            let raw = r.take(32 * count)?;
            let ids: Vec<ContentHash> = raw
                .chunks_exact(32)
                .map(|b| ContentHash(b.try_into().expect("chunks of 32")))
                .collect();
            // The wire form lists each round's ids sorted and once (lookups rely on it).
            if ids.windows(2).any(|w| w[0] >= w[1]) {
                return Err(StateError::Malformed(r.pos()));
            }
            log.push_back((round, ids));
        }
        let mut sampling = Sampling::default();
        if version == STATE_WIRE_VERSION {
            let mut word = || r.u32_le();
            sampling = Sampling { swarm: word()?, period: word()?, prev_period: word()? };
            let ok = |k: u32| (1..=MAX_PERIOD).contains(&k);
            // The v3 form is the only form of a default sampling: one hash per state.
            if !ok(sampling.period) || !ok(sampling.prev_period) || sampling.is_default() {
                return Err(StateError::Malformed(r.pos()));
            }
        }
        if r.remaining() > 0 {
            return Err(StateError::Trailing);
        }
        let index = log.iter().flat_map(|(_, ids)| ids.iter().copied()).collect();
        Ok(Self { fragment, round, parent, anchor, momentum, log, index, sampling })
    }
}

/// Values hashed at a time: one update per value made hashing a 10M-parameter model's
/// states (87 MB) a third of a joining peer's start-up, and blake3 hashes several of its
/// 1 KiB chunks at once only within one update.
const FLOATS_PER_PUT: usize = 2048;

/// Where the wire form goes: a buffer, or straight into the hasher.
trait Sink {
    fn put(&mut self, bytes: &[u8]);

    /// `values` as little-endian f32s.
    fn put_values(&mut self, values: &[f32]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn put_values(&mut self, values: &[f32]) {
        self.reserve(4 * values.len());
        for v in values {
            self.extend_from_slice(&v.to_le_bytes());
        }
    }
}

impl Sink for blake3::Hasher {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }

    fn put_values(&mut self, values: &[f32]) {
        let mut block = [0u8; 4 * FLOATS_PER_PUT];
        for chunk in values.chunks(FLOATS_PER_PUT) {
            for (b, v) in block.chunks_exact_mut(4).zip(chunk) {
                b.copy_from_slice(&v.to_le_bytes());
            }
            self.update(&block[..4 * chunk.len()]);
        }
    }
}

impl From<Short> for StateError {
    fn from(s: Short) -> Self {
        StateError::Malformed(s.at)
    }
}

#[cfg(test)]
mod tests;
