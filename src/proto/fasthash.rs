//! Maps keyed by remote input: content hashes and peer ids that a stranger chooses.
//!
//! An announcement may name any 32 bytes as a "hash", so an unkeyed hasher would let an
//! attacker who read the source pick keys that all land in one bucket (hash flooding).
//! These maps use foldhash's quality hasher with a random seed per process (std's SipHash
//! was measured: it doubled the time of the thousand-peer simulation, whose hot path is map
//! lookups keyed by content hashes). Nothing depends on their
//! iteration order: every order that reaches an output is sorted explicitly (merge inputs
//! by hash, re-announcements, fetch sweeps, vote tallies), so runs stay reproducible.

use foldhash::quality::RandomState;
use std::collections::{HashMap, HashSet};

pub type FastMap<K, V> = HashMap<K, V, RandomState>;
pub type FastSet<K> = HashSet<K, RandomState>;
