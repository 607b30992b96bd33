//! At most one log line per (offender, reason) per time window.
//!
//! Anything an outsider can trigger (a rejected announcement, an over-capacity stream, a
//! failed dial, a bad request) must not turn into one log line per attempt: one hostile
//! peer produced 4,300 WARN lines in 15 s before this existed. Callers count every event
//! in the stats and ask [`LogThrottle::allow`] whether to also log it:
//!
//! ```
//! # use std::time::Instant;
//! # use atoll_net::{logthrottle::LogThrottle, PeerId};
//! let mut throttle: LogThrottle = LogThrottle::default();
//! let peer = PeerId::random();
//! let now = Instant::now();
//! assert!(throttle.allow(peer, "oversized", now));
//! assert!(!throttle.allow(peer, "oversized", now)); // counted as suppressed
//! assert_eq!(throttle.check(peer, "malformed", now), Some(0)); // another reason logs
//! ```
//!
//! The map is bounded ([`LogThrottle::DEFAULT_CAPACITY`] keys). When it is full of keys
//! whose window has not ended, a new key is suppressed rather than evicting an old one, so
//! an attacker rotating peer ids gets at most `capacity` lines per window. No clock is read
//! here: the caller passes `now`. Not `Sync` by itself; wrap it in a `Mutex` to share it
//! between tasks (one short lock per logged-or-not event).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use libp2p::PeerId;

/// The window start and the lines suppressed since of one (peer, reason).
#[derive(Debug, Clone, Copy)]
struct Entry {
    since: Instant,
    suppressed: u64,
}

/// Rate limiter for log lines, keyed by (offender, reason). The offender is a peer id by
/// default; before a handshake it can be anything hashable (a remote IP, an address).
/// See the module docs.
#[derive(Debug)]
pub struct LogThrottle<K = PeerId> {
    window: Duration,
    capacity: usize,
    entries: HashMap<(K, &'static str), Entry>,
    suppressed_total: u64,
}

impl<K: Hash + Eq> Default for LogThrottle<K> {
    fn default() -> Self {
        LogThrottle::new(Self::DEFAULT_WINDOW, Self::DEFAULT_CAPACITY)
    }
}

impl<K: Hash + Eq> LogThrottle<K> {
    /// One line per (peer, reason) per minute.
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);
    /// Keys remembered at once.
    pub const DEFAULT_CAPACITY: usize = 1024;

    /// A throttle with the given window and map capacity (at least 1).
    pub fn new(window: Duration, capacity: usize) -> Self {
        LogThrottle {
            window,
            capacity: capacity.max(1),
            entries: HashMap::new(),
            suppressed_total: 0,
        }
    }

    /// Whether a line about `peer` and `reason` may be logged at `now`. A `false` is
    /// counted as suppressed.
    pub fn allow(&mut self, peer: K, reason: &'static str, now: Instant) -> bool {
        self.check(peer, reason, now).is_some()
    }

    /// Like [`LogThrottle::allow`], but a permitted line also learns how many lines of the
    /// same key were suppressed in the window that just ended (to log as `suppressed = n`).
    pub fn check(&mut self, peer: K, reason: &'static str, now: Instant) -> Option<u64> {
        let key = (peer, reason);
        if let Some(entry) = self.entries.get_mut(&key) {
            if now.saturating_duration_since(entry.since) < self.window {
                entry.suppressed += 1;
                self.suppressed_total += 1;
                return None;
            }
            let suppressed = entry.suppressed;
            *entry = Entry { since: now, suppressed: 0 };
            return Some(suppressed);
        }
        if self.entries.len() >= self.capacity {
            let window = self.window;
            self.entries.retain(|_, e| now.saturating_duration_since(e.since) < window);
            if self.entries.len() >= self.capacity {
                self.suppressed_total += 1;
                return None;
            }
        }
        self.entries.insert(key, Entry { since: now, suppressed: 0 });
        Some(0)
    }

    /// Lines suppressed since this throttle was made.
    pub fn suppressed(&self) -> u64 {
        self.suppressed_total
    }

    /// Keys currently remembered (for tests and the bound).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_peer_and_reason_per_window() {
        let mut t = LogThrottle::<PeerId>::new(Duration::from_secs(60), 16);
        let (a, b) = (PeerId::random(), PeerId::random());
        let t0 = Instant::now();
        assert!(t.allow(a, "x", t0));
        for i in 0..100 {
            assert!(!t.allow(a, "x", t0 + Duration::from_millis(i)));
        }
        assert!(t.allow(a, "y", t0));
        assert!(t.allow(b, "x", t0));
        assert_eq!(t.suppressed(), 100);
        assert_eq!(t.check(a, "x", t0 + Duration::from_secs(60)), Some(100));
        assert_eq!(t.check(a, "x", t0 + Duration::from_secs(61)), None);
    }

    #[test]
    fn full_map_suppresses_new_keys_until_the_window_ends() {
        let mut t = LogThrottle::<PeerId>::new(Duration::from_secs(10), 4);
        let t0 = Instant::now();
        for _ in 0..4 {
            assert!(t.allow(PeerId::random(), "x", t0));
        }
        for _ in 0..100 {
            assert!(!t.allow(PeerId::random(), "x", t0));
        }
        assert_eq!(t.len(), 4);
        assert!(t.allow(PeerId::random(), "x", t0 + Duration::from_secs(10)));
        assert_eq!(t.len(), 1);
    }
}
