//! What fetches remember about sources between fetches: a small reputation that orders
//! holders (sources that were slow go last), the expected answer latency, the fetch-side
//! counters and the throttle of fetch log lines. Shared by the clones of a `NetClient`
//! behind a std mutex (short, no I/O under it). Bounded: [`MAX_SOURCES`] peers.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use libp2p::PeerId;

use super::plan::SourceReport;
use crate::logthrottle::LogThrottle;

/// Most peers with a reputation; the one seen longest ago is forgotten first.
pub const MAX_SOURCES: usize = 1024;
/// Strikes at most (a source can climb back from here in as many good fetches).
pub const MAX_STRIKES: u8 = 8;
/// Expected answer latency before any fetch has measured one.
pub const DEFAULT_PRIOR: Duration = Duration::from_millis(250);

#[derive(Clone, Copy)]
struct Reputation {
    strikes: u8,
    /// Tick of the last fetch it took part in (for eviction).
    seen: u64,
}

/// Reputations, latency prior, counters and the fetch log throttle.
#[derive(Default)]
pub struct SourceBook {
    peers: HashMap<PeerId, Reputation>,
    tick: u64,
    /// Moving average of answer latencies over fetches.
    latency: Option<Duration>,
    /// Chunk requests sent to a second holder.
    pub hedged: u64,
    /// Deadline misses (a source demoted in a fetch).
    pub slow: u64,
    log: LogThrottle<PeerId>,
}

impl SourceBook {
    /// Sorts sources by strikes, fewest first; ties keep the caller's order.
    pub fn order(&self, sources: &mut [PeerId]) {
        sources.sort_by_key(|p| self.peers.get(p).map_or(0, |r| r.strikes));
    }

    /// Strikes of a peer (0 when unknown).
    pub fn strikes(&self, peer: &PeerId) -> u8 {
        self.peers.get(peer).map_or(0, |r| r.strikes)
    }

    /// Expected answer latency of a chunk request.
    pub fn prior(&self) -> Duration {
        self.latency.unwrap_or(DEFAULT_PRIOR)
    }

    /// Learns from a finished (or failed) fetch: a slow source gets a strike, a source that
    /// answered without being slow loses one.
    pub fn learn(&mut self, reports: &[SourceReport]) {
        self.tick += 1;
        for r in reports {
            if let Some(l) = r.latency {
                self.latency = Some(match self.latency {
                    Some(old) => old.mul_f64(0.8) + l.mul_f64(0.2),
                    None => l,
                });
            }
            if !r.slow && r.latency.is_none() && !self.peers.contains_key(&r.peer) {
                continue;
            }
            self.make_room(&r.peer);
            let tick = self.tick;
            let rep = self.peers.entry(r.peer).or_insert(Reputation { strikes: 0, seen: tick });
            rep.seen = tick;
            if r.slow {
                rep.strikes = (rep.strikes + 1).min(MAX_STRIKES);
            } else if r.latency.is_some() {
                rep.strikes = rep.strikes.saturating_sub(1);
            }
        }
    }

    /// Whether to log a line about `peer` for `reason` now (one per peer and reason per
    /// minute); `Some(n)` also tells how many were left out before.
    pub fn log_check(&mut self, peer: PeerId, reason: &'static str, now: Instant) -> Option<u64> {
        self.log.check(peer, reason, now)
    }

    /// Fetch log lines left out by the throttle.
    pub fn log_suppressed(&self) -> u64 {
        self.log.suppressed()
    }

    fn make_room(&mut self, peer: &PeerId) {
        if self.peers.len() < MAX_SOURCES || self.peers.contains_key(peer) {
            return;
        }
        if let Some(old) = self.peers.iter().min_by_key(|(_, r)| r.seen).map(|(p, _)| *p) {
            self.peers.remove(&old);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(peer: PeerId, slow: bool) -> SourceReport {
        SourceReport { peer, latency: Some(Duration::from_millis(10)), slow }
    }

    #[test]
    fn slow_sources_go_last_and_recover() {
        let mut book = SourceBook::default();
        let (a, b, c) = (PeerId::random(), PeerId::random(), PeerId::random());
        book.learn(&[report(a, true), report(b, false)]);
        let mut order = vec![a, b, c];
        book.order(&mut order);
        assert_eq!(order, vec![b, c, a]);
        book.learn(&[report(a, false)]);
        assert_eq!(book.strikes(&a), 0);
        let mut order = vec![a, b, c];
        book.order(&mut order);
        assert_eq!(order, vec![a, b, c]);
        assert!(book.prior() < DEFAULT_PRIOR);
    }

    #[test]
    fn bounded() {
        let mut book = SourceBook::default();
        for _ in 0..(MAX_SOURCES + 10) {
            book.learn(&[report(PeerId::random(), true)]);
        }
        assert_eq!(book.peers.len(), MAX_SOURCES);
    }
}
