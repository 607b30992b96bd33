//! When a peer does its Kademlia work: re-providing the run key, looking the run's
//! providers up, refreshing its routing table. I/O-free: the event loop counts discovery
//! ticks and reports what lookups found and which members it lost.
//!
//! Each of the three is a query to the peers near a key, and each answer lists up to
//! twenty peers with their addresses, so one round of them costs every peer of a swarm of N
//! traffic in N² (16 peers: a fifth of a peer's bytes with all three on a fixed cadence).
//! Member records gossiped in the run already name its peers; Kademlia is the way in for a
//! newcomer and the way back after a partition. So a peer works the DHT hard only while it
//! needs peers — it starts and its lookups still find new run peers, it holds few members
//! and knows of providers it is not connected to, or it lost one lately — and otherwise at
//! a slow, bounded cadence.

use std::time::Duration;

/// Ticks between provider lookups of a peer that does not need peers.
pub(super) const LOOKUP_EVERY: u64 = 10;
/// Ticks between re-provides, and between routing-table refreshes, of a peer that needs
/// peers (a settled peer: [`Schedule::settled_every`]; whichever is shorter).
pub(super) const PROVIDE_EVERY: u64 = 10;
const BOOTSTRAP_EVERY: u64 = 20;
/// Run peers connected below which a peer looks providers up on every tick, while its
/// lookups name providers it is not connected to.
pub(super) const WANTED_RUN_PEERS: usize = 8;
/// Ticks of lookups on every tick after a member was lost (a crash, a partition).
const AFTER_LOSS: u64 = 10;
/// Ticks of lookups on every tick after one that found a run peer we did not know (and
/// at start, before any lookup ended).
const AFTER_FINDING: u64 = 2;
/// A settled peer re-provides this many times within a provider record's lifetime, so a
/// record lapses only if that many re-provides in a row fail.
const PROVIDES_PER_TTL: u32 = 3;

/// What the event loop should do on one discovery tick.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Due {
    pub provide: bool,
    pub lookup: bool,
    pub bootstrap: bool,
}

/// The discovery cadence of one peer.
#[derive(Debug)]
pub(super) struct Schedule {
    tick: u64,
    /// The tick at which a member was last lost.
    lost: Option<u64>,
    /// The tick at which a lookup last found a run peer we did not know (0 at start).
    found: u64,
    /// Ticks between re-provides and refreshes of a peer that needs no peers.
    settled_every: u64,
    last_provide: Option<u64>,
    last_bootstrap: u64,
    /// The latest lookup returned a provider this peer is not connected to (true at start).
    unconnected: bool,
    /// Whether the running lookup has named such a provider so far.
    seen_unconnected: bool,
}

impl Schedule {
    /// `interval` is the discovery tick, `record_ttl` a provider record's lifetime.
    pub(super) fn new(interval: Duration, record_ttl: Duration) -> Self {
        let ticks =
            record_ttl.as_millis() / (interval.as_millis().max(1) * PROVIDES_PER_TTL as u128);
        let settled_every = (ticks as u64).max(1);
        Schedule {
            tick: 0,
            lost: None,
            found: 0,
            settled_every,
            last_provide: None,
            last_bootstrap: 0,
            unconnected: true,
            seen_unconnected: false,
        }
    }

    /// The current tick (1 on the first).
    pub(super) fn tick(&self) -> u64 {
        self.tick
    }

    /// Starts the next tick, with `members` run peers connected. `provided`: our provider
    /// record is believed stored (false at start and after a failure: provide now).
    pub(super) fn next(&mut self, members: usize, provided: bool) -> Due {
        self.tick += 1;
        let t = self.tick;
        let hungry = self.hungry(members);
        let provide_every =
            if hungry { PROVIDE_EVERY.min(self.settled_every) } else { self.settled_every };
        let provide = !provided || self.last_provide.is_none_or(|p| t - p >= provide_every);
        if provide {
            self.last_provide = Some(t);
        }
        let bootstrap_every = if hungry { BOOTSTRAP_EVERY } else { self.settled_every };
        let bootstrap = t - self.last_bootstrap >= bootstrap_every;
        if bootstrap {
            self.last_bootstrap = t;
        }
        Due { provide, lookup: hungry || t % LOOKUP_EVERY == 0, bootstrap }
    }

    /// Whether this peer looks the run's providers up on every tick: while its lookups still
    /// find run peers it did not know (at start too), while it holds fewer than
    /// [`WANTED_RUN_PEERS`] members and its latest lookup named a provider it is not
    /// connected to (or it holds none), or for a while after it lost one. A swarm of 8 or
    /// fewer whose peers are all connected is settled like a larger one.
    pub(super) fn hungry(&self, members: usize) -> bool {
        let t = self.tick;
        members == 0
            || (members < WANTED_RUN_PEERS && self.unconnected)
            || t.saturating_sub(self.found) <= AFTER_FINDING
            || self.lost.is_some_and(|l| t.saturating_sub(l) < AFTER_LOSS)
    }

    /// A lookup found a run peer this peer did not know.
    pub(super) fn found_new(&mut self) {
        self.found = self.tick;
    }

    /// A provider lookup started.
    pub(super) fn lookup_started(&mut self) {
        self.seen_unconnected = false;
    }

    /// The running lookup named a provider this peer is not connected to.
    pub(super) fn saw_unconnected(&mut self) {
        self.seen_unconnected = true;
    }

    /// The running lookup ended.
    pub(super) fn lookup_ended(&mut self) {
        self.unconnected = self.seen_unconnected;
    }

    /// A member disconnected.
    pub(super) fn lost(&mut self) {
        self.lost = Some(self.tick);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_secs(3);
    const TTL: Duration = Duration::from_secs(600);

    /// Runs `ticks` ticks with `members` connected and the record stored, counting each kind
    /// of work.
    fn run(s: &mut Schedule, ticks: u64, members: usize) -> (u64, u64, u64) {
        let mut n = (0, 0, 0);
        for _ in 0..ticks {
            let d = s.next(members, true);
            n.0 += d.provide as u64;
            n.1 += d.lookup as u64;
            n.2 += d.bootstrap as u64;
        }
        n
    }

    #[test]
    fn a_settled_peer_works_the_dht_slowly_and_a_starting_one_at_once() {
        let mut s = Schedule::new(TICK, TTL);
        assert_eq!(s.settled_every, 66);
        // The first tick provides (nothing stored yet) and looks up.
        assert_eq!(s.next(0, false), Due { provide: true, lookup: true, bootstrap: false });
        // Lookups on every tick while they find run peers; two quiet ticks after the last.
        s.found_new();
        assert!(s.next(20, true).lookup && s.next(20, true).lookup);
        assert!(!s.next(20, true).lookup, "well connected and nothing new: no lookup");
        // Settled for an hour (1,200 ticks): lookups every LOOKUP_EVERY ticks, re-provides
        // and refreshes every 66 (within the record's lifetime, a third of it).
        let (provides, lookups, bootstraps) = run(&mut s, 1200, 20);
        assert_eq!(lookups, 1200 / LOOKUP_EVERY);
        assert_eq!((provides, bootstraps), (1200 / 66, 1200 / 66));
        // The fixed cadence it replaces: 120 each of provides and lookups, 60 refreshes.
        assert!(provides + lookups + bootstraps < 120 + 120 + 60);
    }

    #[test]
    fn a_peer_that_needs_peers_looks_on_every_tick() {
        let mut s = Schedule::new(TICK, TTL);
        run(&mut s, 30, 20);
        assert!(!s.hungry(20));
        // Few members while lookups name providers it is not connected to: every tick, and
        // re-provides on the short cadence.
        let (provides, lookups, bootstraps) = run(&mut s, 40, WANTED_RUN_PEERS - 1);
        assert_eq!((provides, lookups, bootstraps), (4, 40, 2));
        // A lookup that names only connected peers: a small swarm all connected is settled.
        s.lookup_started();
        s.lookup_ended();
        assert!(!s.hungry(3) && s.hungry(0), "settled with every provider connected");
        s.lookup_started();
        s.saw_unconnected();
        s.lookup_ended();
        assert!(s.hungry(3) && !s.hungry(WANTED_RUN_PEERS));
        // A member lost: every tick for AFTER_LOSS ticks, then settled again.
        run(&mut s, 100, 20);
        s.lost();
        // Ticks 171–179 hungry, 180 a periodic lookup; then quiet.
        assert_eq!(run(&mut s, AFTER_LOSS, 20).1, AFTER_LOSS);
        assert!(!s.hungry(20));
        assert_eq!(run(&mut s, LOOKUP_EVERY - 1, 20).1, 0);
    }

    #[test]
    fn a_failed_provide_is_retried_on_the_next_tick() {
        let mut s = Schedule::new(TICK, TTL);
        run(&mut s, 50, 20);
        assert!(!s.next(20, true).provide);
        assert!(s.next(20, false).provide);
        assert!(!s.next(20, true).provide);
    }

    #[test]
    fn a_fast_tick_still_re_provides_within_the_record_lifetime() {
        let s = Schedule::new(Duration::from_millis(100), TTL);
        assert_eq!(s.settled_every, 2000);
        // A long tick re-provides often enough too, hungry or not.
        let mut s = Schedule::new(Duration::from_secs(60), TTL);
        assert_eq!(s.settled_every, 3);
        assert_eq!(run(&mut s, 30, 0).0, 10);
    }
}
