//! What the swarm task remembers about other peers: run membership, penalties, rejects,
//! bytes per peer, and which complaints were logged lately (at most one line per peer and
//! reason per [`LogThrottle::DEFAULT_WINDOW`]). Every map is bounded.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use libp2p::PeerId;
use tracing::warn;

use crate::counters::{ByteCount, RejectReason};
use crate::logthrottle::LogThrottle;

/// Most peers remembered as run members (discovered, connected or not).
pub const MAX_KNOWN_RUN_PEERS: usize = 4096;
/// Most peers with a per-peer byte count.
pub const MAX_TRACKED_PEERS: usize = 1024;
/// Most peers in the penalty box.
pub const MAX_PENALISED: usize = 4096;
/// Most (peer, reason) pairs remembered by the log throttle.
pub const MAX_LOGGED: usize = 4096;
/// How long a run peer whose dial failed is not dialled again (its provider record may
/// outlive it by minutes).
pub const DIAL_BACKOFF: Duration = Duration::from_secs(15);
/// Most peers remembered with a failed dial.
pub const MAX_DIAL_BACKOFF: usize = 4096;
/// How long a peer that served bad data is not asked for data.
pub const PENALTY: Duration = Duration::from_secs(600);

/// The log throttle with this module's capacity.
struct Throttle(LogThrottle<String>);

impl Default for Throttle {
    fn default() -> Self {
        Throttle(LogThrottle::new(LogThrottle::<String>::DEFAULT_WINDOW, MAX_LOGGED))
    }
}

/// Bookkeeping about remote peers.
#[derive(Default)]
pub struct PeerBook {
    /// Peers known to be in our run (provider record or topic subscription).
    pub known_run: HashSet<PeerId>,
    /// Run peers currently connected (we emitted `RunPeerJoined` for them).
    pub members: HashSet<PeerId>,
    /// Penalised peers and when their penalty ends.
    penalised: HashMap<PeerId, Instant>,
    /// Rejections by reason.
    pub rejects: BTreeMap<RejectReason, u64>,
    /// Payload bytes per peer.
    pub bytes: HashMap<PeerId, ByteCount>,
    /// (who, reason) logged within the window; `who` is a peer id or a remote IP.
    log: Throttle,
    /// Peers whose last dial failed, and when.
    dial_failed: HashMap<PeerId, Instant>,
}

impl PeerBook {
    /// Remembers a run peer; true if it was new.
    pub fn learn_run_peer(&mut self, peer: PeerId) -> bool {
        if self.known_run.len() >= MAX_KNOWN_RUN_PEERS && !self.known_run.contains(&peer) {
            // Forget a peer that is not connected to make room.
            let victim = self.known_run.iter().find(|p| !self.members.contains(p)).copied();
            match victim {
                Some(v) => {
                    self.known_run.remove(&v);
                }
                None => return false,
            }
        }
        self.known_run.insert(peer)
    }

    /// Notes a failed dial to `peer`.
    pub fn dial_failed(&mut self, peer: PeerId, now: Instant) {
        if self.dial_failed.len() >= MAX_DIAL_BACKOFF {
            self.dial_failed.retain(|_, t| now.saturating_duration_since(*t) < DIAL_BACKOFF);
            if self.dial_failed.len() >= MAX_DIAL_BACKOFF {
                return;
            }
        }
        self.dial_failed.insert(peer, now);
    }

    /// Notes a connection to `peer` (clears its dial backoff).
    pub fn connected(&mut self, peer: &PeerId) {
        self.dial_failed.remove(peer);
    }

    /// True unless a dial to `peer` failed within [`DIAL_BACKOFF`].
    pub fn may_dial(&self, peer: &PeerId, now: Instant) -> bool {
        self.dial_failed.get(peer).is_none_or(|t| now.saturating_duration_since(*t) >= DIAL_BACKOFF)
    }

    /// Counts a rejection and logs it at most once per `who`, reason and window.
    pub fn reject(&mut self, who: String, reason: RejectReason, detail: &str) {
        *self.rejects.entry(reason).or_default() += 1;
        if let Some(suppressed) = self.log.0.check(who.clone(), reason.as_str(), Instant::now()) {
            warn!(
                from = %who,
                reason = reason.as_str(),
                detail,
                suppressed,
                "rejected (one line per peer and reason per minute; see the rejects counters)"
            );
        }
    }

    /// Whether a line about `who` and `reason` may be logged now (see [`LogThrottle`]).
    pub fn may_log(&mut self, who: String, reason: &'static str) -> bool {
        self.log.0.allow(who, reason, Instant::now())
    }

    /// Log lines left out so far.
    pub fn log_suppressed(&self) -> u64 {
        self.log.0.suppressed()
    }

    /// Forgets a run peer (banned: never dial it again).
    pub fn forget_run_peer(&mut self, peer: &PeerId) {
        self.known_run.remove(peer);
        self.dial_failed.remove(peer);
    }

    /// Puts a peer in the penalty box.
    pub fn penalise(&mut self, peer: PeerId, now: Instant) {
        if self.penalised.len() >= MAX_PENALISED {
            self.penalised.retain(|_, until| *until > now);
            if self.penalised.len() >= MAX_PENALISED {
                return;
            }
        }
        self.penalised.insert(peer, now + PENALTY);
    }

    /// True while the peer's penalty lasts.
    pub fn is_penalised(&mut self, peer: &PeerId, now: Instant) -> bool {
        match self.penalised.get(peer) {
            Some(until) if *until > now => true,
            Some(_) => {
                self.penalised.remove(peer);
                false
            }
            None => false,
        }
    }

    /// Number of peers currently penalised.
    pub fn penalised_count(&self, now: Instant) -> usize {
        self.penalised.values().filter(|u| **u > now).count()
    }

    /// Adds payload bytes for a peer.
    pub fn add_bytes(&mut self, peer: PeerId, sent: u64, received: u64) {
        if !self.bytes.contains_key(&peer) && self.bytes.len() >= MAX_TRACKED_PEERS {
            // Evict the peer with the least traffic.
            if let Some(v) =
                self.bytes.iter().min_by_key(|(_, b)| b.sent + b.received).map(|(p, _)| *p)
            {
                self.bytes.remove(&v);
            }
        }
        let b = self.bytes.entry(peer).or_default();
        b.sent += sent;
        b.received += received;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalty_expires_and_rejects_count() {
        let mut book = PeerBook::default();
        let p = PeerId::random();
        let t0 = Instant::now();
        book.penalise(p, t0);
        assert!(book.is_penalised(&p, t0));
        assert_eq!(book.penalised_count(t0), 1);
        assert!(!book.is_penalised(&p, t0 + PENALTY + Duration::from_secs(1)));
        for _ in 0..3 {
            book.reject(p.to_string(), RejectReason::Malformed, "x");
        }
        assert_eq!(book.rejects[&RejectReason::Malformed], 3);
        assert_eq!(book.log.0.len(), 1);
        assert_eq!(book.log_suppressed(), 2);
    }

    #[test]
    fn dial_backoff_expires_and_clears_on_connect() {
        let mut book = PeerBook::default();
        let p = PeerId::random();
        let t0 = Instant::now();
        assert!(book.may_dial(&p, t0));
        book.dial_failed(p, t0);
        assert!(!book.may_dial(&p, t0 + Duration::from_secs(1)));
        assert!(book.may_dial(&p, t0 + DIAL_BACKOFF));
        book.dial_failed(p, t0);
        book.connected(&p);
        assert!(book.may_dial(&p, t0));
    }

    #[test]
    fn per_peer_bytes_are_bounded() {
        let mut book = PeerBook::default();
        for i in 0..(MAX_TRACKED_PEERS + 10) {
            book.add_bytes(PeerId::random(), i as u64, 0);
        }
        assert_eq!(book.bytes.len(), MAX_TRACKED_PEERS);
    }
}
