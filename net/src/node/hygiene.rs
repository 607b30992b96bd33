//! Network hygiene on the swarm task: strikes, bans, the combined block list, the
//! per-source and per-author gossip rate limits and the per-author heartbeat rate limit. See
//! [`crate::bans`] for the policy.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::time::Instant;

use libp2p::PeerId;
use tracing::{debug, warn};

use super::event_loop::EventLoop;
use crate::bans::{self, Strikes, BAN_STRIKES, MAX_BANS, SHOWN_PEERS};
use crate::client::NetEvent;
use crate::counters::{BannedPeer, StruckPeer};
use crate::heartbeat::{HEARTBEAT_BURST, HEARTBEAT_RATE};

/// Announcements accepted from one propagation source in a burst.
pub const ANNOUNCE_BURST: f64 = 256.0;
/// Announcements per second accepted from one propagation source, sustained.
pub const ANNOUNCE_RATE: f64 = 128.0;
/// Gossip messages accepted from one signed author in a burst, whoever forwards them.
pub const AUTHOR_BURST: f64 = 128.0;
/// Gossip messages per second accepted from one signed author, sustained: half of a
/// forwarder's, which carries many authors. An honest peer of the test suite's fastest
/// runs (6 tiny-model peers on 2 cores, `tests/sampled_swarm.rs`) merges about 20 rounds
/// and publishes about 10 deltas a second, each with an announcement.
pub const AUTHOR_RATE: f64 = 64.0;
/// Most sources with a token bucket (above the 512 connections a node accepts).
pub const MAX_BUCKETS: usize = 1024;

/// What the swarm task keeps for hygiene.
#[derive(Debug)]
pub(crate) struct Hygiene {
    strikes: Strikes,
    /// Strikes given, by reason.
    pub(crate) strike_counts: BTreeMap<&'static str, u64>,
    /// Banned for the run (bounded by [`MAX_BANS`]).
    pub(crate) banned: HashSet<PeerId>,
    /// The latest bans of this run with their reason and time, newest last (at most
    /// [`SHOWN_PEERS`]): who was cut off and why, for operators.
    recent_bans: VecDeque<(PeerId, &'static str, Instant)>,
    /// Blocked by fault injection (tests only).
    fault_blocked: HashSet<PeerId>,
    ban_file: Option<PathBuf>,
    /// Gossip messages per propagation source.
    announcements: RateBuckets,
    /// Gossip messages per signed author: one author flooding through many forwarders
    /// stays within one author's budget.
    authors: RateBuckets,
    /// Heartbeats per signed author.
    heartbeats: RateBuckets,
}

/// A token bucket per peer, at most [`MAX_BUCKETS`] of them.
#[derive(Debug)]
pub(crate) struct RateBuckets {
    burst: f64,
    rate: f64,
    buckets: HashMap<PeerId, (f64, Instant)>,
}

impl RateBuckets {
    fn new(burst: f64, rate: f64) -> Self {
        RateBuckets { burst, rate, buckets: HashMap::new() }
    }

    /// True if one more message of `peer` fits its bucket (and takes the token).
    pub(crate) fn admit(&mut self, peer: PeerId, now: Instant) -> bool {
        if !self.buckets.contains_key(&peer) && self.buckets.len() >= MAX_BUCKETS {
            // Forget peers whose bucket refilled (they are idle), else any one.
            let (burst, rate) = (self.burst, self.rate);
            self.buckets.retain(|_, (t, at)| refill(*t, *at, now, burst, rate) < burst);
            if self.buckets.len() >= MAX_BUCKETS {
                if let Some(p) = self.buckets.keys().next().copied() {
                    self.buckets.remove(&p);
                }
            }
        }
        let (tokens, at) = self.buckets.entry(peer).or_insert((self.burst, now));
        let available = refill(*tokens, *at, now, self.burst, self.rate);
        *at = now;
        if available >= 1.0 {
            *tokens = available - 1.0;
            true
        } else {
            *tokens = available;
            false
        }
    }
}

impl Hygiene {
    /// Loads the ban file (if any); a bad line is skipped with one warning.
    pub(crate) fn new(ban_file: Option<PathBuf>) -> Self {
        let mut h = Hygiene { ban_file, ..Hygiene::default() };
        let Some(path) = h.ban_file.clone() else { return h };
        match bans::read(&path) {
            Ok(loaded) => {
                if let Some((line, text)) = &loaded.first_bad {
                    warn!(
                        path = %path.display(),
                        skipped = loaded.skipped,
                        first_bad_line = line,
                        text = %text,
                        "ban file: lines that are not peer ids were skipped"
                    );
                }
                h.banned = loaded.peers;
            }
            Err(e) => {
                warn!(path = %path.display(), error = %e, "ban file unreadable; no bans loaded")
            }
        }
        h
    }

    /// Token bucket per propagation source: true if one more announcement fits.
    pub(crate) fn admit_announcement(&mut self, source: PeerId, now: Instant) -> bool {
        self.announcements.admit(source, now)
    }

    /// Token bucket per signed author (unsigned messages share the forwarder's budget
    /// only): true if one more gossip message of `author` fits.
    pub(crate) fn admit_author(&mut self, author: Option<PeerId>, now: Instant) -> bool {
        author.is_none_or(|a| self.authors.admit(a, now))
    }

    /// Token bucket per signed author: true if one more heartbeat fits.
    pub(crate) fn admit_heartbeat(&mut self, author: PeerId, now: Instant) -> bool {
        self.heartbeats.admit(author, now)
    }

    pub(crate) fn is_banned(&self, peer: &PeerId) -> bool {
        self.banned.contains(peer)
    }

    /// Records a ban for [`Self::recent_bans`].
    fn note_ban(&mut self, peer: PeerId, reason: &'static str, now: Instant) {
        if self.recent_bans.len() >= SHOWN_PEERS {
            self.recent_bans.pop_front();
        }
        self.recent_bans.push_back((peer, reason, now));
    }

    /// The peers with the most standing strikes and the latest bans, for [`crate::NetStats`]
    /// (`started`: when the node started, for the bans' times).
    pub(crate) fn suspects(
        &self,
        started: Instant,
        now: Instant,
    ) -> (Vec<StruckPeer>, Vec<BannedPeer>) {
        let struck = self
            .strikes
            .most(SHOWN_PEERS, now)
            .into_iter()
            .map(|(p, strikes)| StruckPeer { peer: p.to_string(), strikes })
            .collect();
        let bans = self
            .recent_bans
            .iter()
            .map(|(p, reason, at)| BannedPeer {
                peer: p.to_string(),
                reason: (*reason).to_owned(),
                at_secs: at.saturating_duration_since(started).as_secs(),
            })
            .collect();
        (struck, bans)
    }
}

impl Default for Hygiene {
    fn default() -> Self {
        Hygiene {
            strikes: Strikes::default(),
            strike_counts: BTreeMap::new(),
            banned: HashSet::new(),
            recent_bans: VecDeque::new(),
            fault_blocked: HashSet::new(),
            ban_file: None,
            announcements: RateBuckets::new(ANNOUNCE_BURST, ANNOUNCE_RATE),
            authors: RateBuckets::new(AUTHOR_BURST, AUTHOR_RATE),
            heartbeats: RateBuckets::new(HEARTBEAT_BURST, HEARTBEAT_RATE),
        }
    }
}

fn refill(tokens: f64, at: Instant, now: Instant, burst: f64, rate: f64) -> f64 {
    (tokens + now.saturating_duration_since(at).as_secs_f64() * rate).min(burst)
}

impl EventLoop {
    /// Blocks every peer of the loaded ban file (called once at start).
    pub(super) fn apply_loaded_bans(&mut self) {
        let banned: Vec<PeerId> = self.hygiene.banned.iter().copied().collect();
        for p in banned {
            self.swarm.behaviour_mut().blocked.block_peer(p);
            self.swarm.behaviour_mut().gossipsub.blacklist_peer(&p);
        }
    }

    /// One strike (`weight` of one) against `peer` for `reason`: lowers its gossipsub score
    /// and bans it at [`BAN_STRIKES`].
    pub(super) fn strike(&mut self, peer: PeerId, reason: &'static str, weight: f64) {
        if peer == *self.swarm.local_peer_id() || self.hygiene.is_banned(&peer) {
            return;
        }
        *self.hygiene.strike_counts.entry(reason).or_default() += 1;
        let standing = self.hygiene.strikes.add(peer, weight, Instant::now());
        self.swarm.behaviour_mut().gossipsub.set_application_score(&peer, -standing);
        if self.peers.may_log(peer.to_string(), "strike") {
            debug!(peer = %peer, reason, standing, "strike");
        }
        // Rounded: strikes given within minutes of each other count whole.
        if standing.round() >= BAN_STRIKES {
            self.ban(peer, reason);
        }
    }

    /// Bans `peer` for the run: refused both ways, disconnected, out of the DHT and the
    /// gossip mesh, persisted.
    fn ban(&mut self, peer: PeerId, reason: &'static str) {
        if self.hygiene.banned.len() >= MAX_BANS {
            if self.peers.may_log("ban list".into(), "full") {
                warn!(limit = MAX_BANS, "ban list full; misbehaving peers are only graylisted");
            }
            return;
        }
        self.hygiene.banned.insert(peer);
        self.hygiene.strikes.remove(&peer);
        self.hygiene.note_ban(peer, reason, Instant::now());
        let b = self.swarm.behaviour_mut();
        b.blocked.block_peer(peer);
        b.gossipsub.blacklist_peer(&peer);
        b.kad.remove_peer(&peer);
        let _ = self.swarm.disconnect_peer_id(peer);
        self.peers.forget_run_peer(&peer);
        if self.peers.may_log(peer.to_string(), "banned") {
            warn!(peer = %peer, reason, strikes = BAN_STRIKES, "peer banned for the run");
        }
        if let Some(path) = &self.hygiene.ban_file {
            if let Err(e) = bans::write(path, &self.hygiene.banned) {
                warn!(path = %path.display(), error = %e, "cannot write the ban file");
            }
        }
        self.emit(NetEvent::PeerBanned { peer, reason });
    }

    /// Fault injection: blocks `peer` (it stays blocked while banned, too).
    pub(super) fn fault_block(&mut self, peer: PeerId) {
        self.hygiene.fault_blocked.insert(peer);
        self.swarm.behaviour_mut().blocked.block_peer(peer);
    }

    /// Fault injection: lifts the fault block of `peer`, unless it is banned.
    pub(super) fn fault_unblock(&mut self, peer: PeerId) {
        self.hygiene.fault_blocked.remove(&peer);
        if !self.hygiene.is_banned(&peer) {
            self.swarm.behaviour_mut().blocked.unblock_peer(peer);
        }
    }

    /// Banned peers, sorted.
    pub(super) fn banned_peers(&self) -> Vec<PeerId> {
        let mut v: Vec<PeerId> = self.hygiene.banned.iter().copied().collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_latest_bans_are_named_with_their_reason() {
        let mut h = Hygiene::default();
        let t0 = Instant::now();
        let peers: Vec<PeerId> = (0..SHOWN_PEERS + 2).map(|_| PeerId::random()).collect();
        for (i, p) in peers.iter().enumerate() {
            h.note_ban(
                *p,
                if i % 2 == 0 { "bad_delta" } else { "unserved" },
                t0 + Duration::from_secs(i as u64),
            );
        }
        h.strikes.add(peers[0], 2.0, t0);
        let (struck, bans) = h.suspects(t0, t0);
        assert_eq!(struck, vec![StruckPeer { peer: peers[0].to_string(), strikes: 2.0 }]);
        assert_eq!(bans.len(), SHOWN_PEERS, "bounded");
        let last = bans.last().unwrap();
        assert_eq!(last.peer, peers[SHOWN_PEERS + 1].to_string(), "newest last");
        assert_eq!((last.reason.as_str(), last.at_secs), ("unserved", SHOWN_PEERS as u64 + 1));
        assert_eq!(bans[0].peer, peers[2].to_string(), "the oldest went first");
    }

    #[test]
    fn token_bucket_limits_one_source_and_refills() {
        let mut h = Hygiene::default();
        let (a, b) = (PeerId::random(), PeerId::random());
        let t0 = Instant::now();
        let admitted = (0..1000).filter(|_| h.admit_announcement(a, t0)).count();
        assert_eq!(admitted, ANNOUNCE_BURST as usize);
        assert!(h.admit_announcement(b, t0), "another source has its own bucket");
        let t1 = t0 + Duration::from_secs(1);
        let admitted = (0..1000).filter(|_| h.admit_announcement(a, t1)).count();
        assert_eq!(admitted, ANNOUNCE_RATE as usize);
    }

    #[test]
    fn one_author_through_many_forwarders_has_one_budget() {
        let mut h = Hygiene::default();
        let author = PeerId::random();
        let forwarders: Vec<PeerId> = (0..8).map(|_| PeerId::random()).collect();
        let t0 = Instant::now();
        // 8 forwarders each pass 100 of the author's messages: well under their own
        // budgets, 800 in all, but only the author's burst gets through.
        let admitted = (0..800)
            .filter(|i| {
                let f = forwarders[i % forwarders.len()];
                h.admit_announcement(f, t0) && h.admit_author(Some(author), t0)
            })
            .count();
        assert_eq!(admitted, AUTHOR_BURST as usize);
        // A second later, the sustained rate.
        let t1 = t0 + Duration::from_secs(1);
        let admitted = (0..100).filter(|_| h.admit_author(Some(author), t1)).count();
        assert_eq!(admitted, AUTHOR_RATE as usize);
        // Another author, through the same forwarders, has its own budget.
        assert!(h.admit_author(Some(PeerId::random()), t1));
        assert!(h.admit_author(None, t1), "unsigned: the forwarder's budget only");
        // An honest author at twice the suite's fastest rate never runs dry.
        let honest = PeerId::random();
        for i in 1..=1000u32 {
            let t = t0 + Duration::from_millis(17) * i;
            assert!(h.admit_author(Some(honest), t), "honest message {i} refused");
        }
    }

    #[test]
    fn buckets_are_bounded() {
        let mut h = Hygiene::default();
        let t0 = Instant::now();
        for _ in 0..MAX_BUCKETS + 50 {
            assert!(h.admit_announcement(PeerId::random(), t0));
        }
        assert!(h.announcements.buckets.len() <= MAX_BUCKETS);
    }

    #[test]
    fn heartbeats_are_limited_per_author() {
        let mut h = Hygiene::default();
        let (a, b) = (PeerId::random(), PeerId::random());
        let t0 = Instant::now();
        let admitted = (0..100).filter(|_| h.admit_heartbeat(a, t0)).count();
        assert_eq!(admitted, HEARTBEAT_BURST as usize);
        assert!(h.admit_heartbeat(b, t0), "another author has its own bucket");
        // An honest author (one every MIN_HEARTBEAT_GAP) never runs dry.
        let gap = crate::heartbeat::MIN_HEARTBEAT_GAP;
        for i in 1..=100 {
            assert!(h.admit_heartbeat(b, t0 + gap * i), "honest heartbeat {i} refused");
        }
        // Announcements of `a` are a separate budget.
        assert!(h.admit_announcement(a, t0));
    }
}
