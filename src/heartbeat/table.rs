//! The run's peers as their heartbeats describe them: a bounded table kept by every peer
//! (training or not) and written to `RUN_DIR/swarm.json` as a [`SwarmView`].
//!
//! Bounds: at most [`MAX_PEERS`] authors (a new one evicts the entry heard longest ago),
//! an entry expires [`EXPIRE_MS`] after its last heartbeat. Pure: the caller passes the
//! time (unix ms), so the table is tested without clocks.
//!
//! Next to heartbeats the table keeps what this peer's own network layer says: which run
//! peers are connected and since when, and since when none is (`alone_since`). `atoll
//! doctor` compares the two views (see `crate::doctor`).

use std::collections::BTreeMap;

use atoll_net::PeerId;
use serde::{Deserialize, Serialize};

use super::{Heartbeat, HeartbeatError};

/// Most peers in the table.
pub const MAX_PEERS: usize = 1024;
/// A peer leaves the table this long after its last heartbeat.
pub const EXPIRE_MS: u64 = 60_000;
/// Most connected run peers whose connection time is remembered (atoll-net keeps fewer
/// connections than this).
pub const MAX_CONNECTED: usize = 4096;

#[derive(Debug, Clone)]
struct Entry {
    heartbeat: Heartbeat,
    received_unix_ms: u64,
    first_heard_unix_ms: u64,
}

/// What this peer knows of its run's peers.
#[derive(Debug, Clone)]
pub struct SwarmTable {
    entries: BTreeMap<PeerId, Entry>,
    /// Connected run peers and since when (unix ms).
    connected: BTreeMap<PeerId, u64>,
    /// Since when no run peer is connected (`None` while one is).
    alone_since: Option<u64>,
    /// Our own row, as of the latest tick.
    own: Option<Heartbeat>,
    /// Entries pushed out by newcomers when the table was full.
    evicted: u64,
    /// Heartbeats that did not decode, by reason.
    refused: BTreeMap<&'static str, u64>,
}

/// One peer of the table, as written to `swarm.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerEntry {
    pub peer: String,
    /// When its latest heartbeat arrived (our clock).
    pub received_unix_ms: u64,
    /// When we first heard it (since it last expired).
    pub first_heard_unix_ms: u64,
    /// Its clock minus ours when its latest heartbeat arrived: positive when its clock is
    /// ahead; the gossip delay makes it read low by that delay.
    pub clock_offset_ms: i64,
    #[serde(flatten)]
    pub heartbeat: Heartbeat,
}

/// A connected run peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connected {
    pub peer: String,
    pub since_unix_ms: u64,
}

/// `RUN_DIR/swarm.json`: the run seen from one peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwarmView {
    /// When it was written (unix ms).
    pub updated_unix_ms: u64,
    /// This peer.
    pub peer_id: String,
    /// This peer's own row, as of the write (its heartbeats say the same every 5 s).
    pub own: Option<Heartbeat>,
    /// The peers heard in the last [`EXPIRE_MS`], sorted by peer id.
    pub peers: Vec<PeerEntry>,
    /// Run peers connected now (atoll-net's view: discovery and dialling), sorted.
    pub connected: Vec<Connected>,
    /// Since when no run peer is connected (`None` while one is).
    pub alone_since_unix_ms: Option<u64>,
    /// Entries evicted because the table was full.
    pub evicted: u64,
    /// Heartbeats refused, by reason (`malformed`, `version`).
    pub refused: BTreeMap<String, u64>,
}

impl SwarmTable {
    /// An empty table at `now`: alone until a run peer connects.
    pub fn new(now: u64) -> Self {
        SwarmTable {
            entries: BTreeMap::new(),
            connected: BTreeMap::new(),
            alone_since: Some(now),
            own: None,
            evicted: 0,
            refused: BTreeMap::new(),
        }
    }

    /// A heartbeat of `peer` arrived at `now`.
    pub fn heard(&mut self, peer: PeerId, heartbeat: Heartbeat, now: u64) {
        if !self.entries.contains_key(&peer) && self.entries.len() >= MAX_PEERS {
            let oldest = self.entries.iter().min_by_key(|(_, e)| e.received_unix_ms);
            if let Some(p) = oldest.map(|(p, _)| *p) {
                self.entries.remove(&p);
                self.evicted += 1;
            }
        }
        let first = self.entries.get(&peer).map_or(now, |e| e.first_heard_unix_ms);
        let entry = Entry { heartbeat, received_unix_ms: now, first_heard_unix_ms: first };
        self.entries.insert(peer, entry);
    }

    /// A heartbeat that did not decode.
    pub fn refused(&mut self, e: &HeartbeatError) {
        let reason = match e {
            HeartbeatError::Version(_) => "version",
            _ => "malformed",
        };
        *self.refused.entry(reason).or_default() += 1;
    }

    /// Our own row.
    pub fn set_own(&mut self, heartbeat: Heartbeat) {
        self.own = Some(heartbeat);
    }

    /// The run peers atoll-net is connected to at `now`.
    pub fn connected(&mut self, run_peers: &[PeerId], now: u64) {
        let before = std::mem::take(&mut self.connected);
        for p in run_peers.iter().take(MAX_CONNECTED) {
            self.connected.insert(*p, before.get(p).copied().unwrap_or(now));
        }
        match (self.connected.is_empty(), self.alone_since) {
            (true, None) => self.alone_since = Some(now),
            (false, Some(_)) => self.alone_since = None,
            _ => {}
        }
    }

    /// Drops the peers not heard for [`EXPIRE_MS`].
    pub fn expire(&mut self, now: u64) {
        self.entries.retain(|_, e| now.saturating_sub(e.received_unix_ms) < EXPIRE_MS);
    }

    /// Peers in the table.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The table as written to `swarm.json`, at `now`, for peer `me`.
    pub fn view(&self, me: &PeerId, now: u64) -> SwarmView {
        let peers = self
            .entries
            .iter()
            .map(|(p, e)| PeerEntry {
                peer: p.to_string(),
                received_unix_ms: e.received_unix_ms,
                first_heard_unix_ms: e.first_heard_unix_ms,
                clock_offset_ms: offset(e.heartbeat.sent_unix_ms, e.received_unix_ms),
                heartbeat: e.heartbeat.clone(),
            })
            .collect();
        let connected = self
            .connected
            .iter()
            .map(|(p, t)| Connected { peer: p.to_string(), since_unix_ms: *t })
            .collect();
        SwarmView {
            updated_unix_ms: now,
            peer_id: me.to_string(),
            own: self.own.clone(),
            peers,
            connected,
            alone_since_unix_ms: self.alone_since,
            evicted: self.evicted,
            refused: self.refused.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }
}

/// `their − ours` in ms, saturating.
fn offset(theirs: u64, ours: u64) -> i64 {
    let d = i128::from(theirs) - i128::from(ours);
    d.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use atoll_net::Reachability;

    fn hb(step: u64, sent: u64) -> Heartbeat {
        Heartbeat {
            version: "0.1.0".into(),
            trains: true,
            manifest: None,
            step,
            tokens_per_s: 1.0,
            val_bpb: None,
            rounds: vec![1],
            anchors: Vec::new(),
            merges: 0,
            reachability: Reachability::Unknown,
            run_peers: 1,
            sent_unix_ms: sent,
        }
    }

    #[test]
    fn newest_heartbeat_wins_and_offsets_are_theirs_minus_ours() {
        let mut t = SwarmTable::new(0);
        let p = PeerId::random();
        t.heard(p, hb(1, 900), 1_000);
        t.heard(p, hb(2, 7_000), 2_000);
        let v = t.view(&PeerId::random(), 2_500);
        assert_eq!(v.peers.len(), 1);
        assert_eq!(v.peers[0].heartbeat.step, 2);
        assert_eq!(v.peers[0].first_heard_unix_ms, 1_000);
        assert_eq!(v.peers[0].clock_offset_ms, 5_000);
        assert_eq!(offset(0, u64::MAX), i64::MIN);
    }

    #[test]
    fn the_table_is_bounded_and_entries_expire() {
        let mut t = SwarmTable::new(0);
        let first = PeerId::random();
        t.heard(first, hb(0, 0), 0);
        for i in 1..MAX_PEERS as u64 + 10 {
            t.heard(PeerId::random(), hb(i, i), i);
        }
        assert_eq!(t.len(), MAX_PEERS);
        let v = t.view(&PeerId::random(), 0);
        assert_eq!(v.evicted, 10);
        assert!(v.peers.iter().all(|e| e.peer != first.to_string()), "oldest evicted first");
        // Left: heard at 10..=1033 ms; those heard at ≤ 500 ms are EXPIRE_MS old at this time.
        t.expire(EXPIRE_MS + 500);
        assert_eq!(t.len(), 1033 - 500);
        t.expire(10 * EXPIRE_MS);
        assert!(t.is_empty());
    }

    #[test]
    fn connection_times_and_loneliness() {
        let mut t = SwarmTable::new(100);
        let (a, b) = (PeerId::random(), PeerId::random());
        assert_eq!(t.view(&a, 100).alone_since_unix_ms, Some(100));
        t.connected(&[a], 200);
        t.connected(&[a, b], 300);
        let v = t.view(&a, 300);
        assert_eq!(v.alone_since_unix_ms, None);
        let since: Vec<(String, u64)> =
            v.connected.iter().map(|c| (c.peer.clone(), c.since_unix_ms)).collect();
        let mut want = [(a.to_string(), 200), (b.to_string(), 300)];
        want.sort();
        assert_eq!(since, want);
        t.connected(&[], 400);
        t.connected(&[], 500);
        assert_eq!(t.view(&a, 500).alone_since_unix_ms, Some(400));
    }
}
