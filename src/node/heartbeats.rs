//! A peer's heartbeats (see [`crate::heartbeat`]): it publishes its own every
//! [`HEARTBEAT_EVERY`], more seldom in larger runs ([`heartbeat_every`]) (at start, and
//! soon after a run peer connects, never closer than atoll-net's [`MIN_HEARTBEAT_GAP`]),
//! keeps the table of the run's peers from theirs, and hands `swarm.json` to the disk
//! thread. Training peers and `--no-train` peers alike.

use std::time::Duration;

use atoll_net::heartbeat::{spread, MIN_HEARTBEAT_GAP};
use atoll_net::{NetStats, PeerId};

use crate::heartbeat::table::{SwarmTable, SwarmView};
use crate::heartbeat::{self, Heartbeat, HeartbeatError};
use crate::rundir::status::TrainingStatus;

/// How often a peer of a small run publishes its heartbeat ([`heartbeat_every`]).
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);
/// The longest gap between a peer's heartbeats in a large run: half the time after which
/// a silent peer leaves the table ([`EXPIRE_MS`](crate::heartbeat::table::EXPIRE_MS)).
const HEARTBEAT_EVERY_MAX: Duration = Duration::from_secs(30);

/// The gap between a peer's heartbeats in a run where it sees `run_peers` other peers: one
/// second per peer of the run (atoll-net's [`spread`]: 16 idle peers sent 16.7 KB/s each
/// with heartbeats every 5 s and member records every 10 s, 9.6 KB/s with both spread;
/// bench/RESULTS.md), 5 s to 30 s.
pub fn heartbeat_every(run_peers: usize) -> Duration {
    spread(run_peers.saturating_add(1), HEARTBEAT_EVERY, HEARTBEAT_EVERY_MAX)
}
/// After a run peer connects, our next heartbeat goes out this soon (its subscription has
/// reached us by then), so a newcomer sees the swarm within seconds.
const SOON: Duration = Duration::from_secs(1);
/// A heartbeat nobody received (no peer yet) is tried again this soon.
const RETRY: Duration = Duration::from_secs(1);
/// How often `swarm.json` is rewritten.
const WRITE_EVERY: Duration = Duration::from_secs(1);

/// Test hook: shifts the clock this peer's heartbeats see by this many ms (signed): the
/// clock it sends and the clock it compares arrivals with, as a wrong system clock would.
/// The rounds keep the real clock. `atoll doctor`'s clock check is tested with it.
pub const SKEW_ENV: &str = "ATOLL_TEST_HEARTBEAT_SKEW_MS";

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// What a peer keeps for heartbeats.
#[derive(Debug)]
pub struct Beacon {
    table: SwarmTable,
    /// When (unix ms) our next heartbeat is due.
    next_at: u64,
    /// When our last heartbeat went out.
    last_sent: Option<u64>,
    /// When `swarm.json` was last handed to the disk.
    last_written: Option<u64>,
    skew_ms: i64,
}

impl Beacon {
    /// A beacon whose first heartbeat is due at once.
    pub fn new(now: u64) -> Self {
        let skew_ms = std::env::var(SKEW_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        if skew_ms != 0 {
            tracing::warn!(skew_ms, "test hook: heartbeats carry a shifted clock");
        }
        Beacon {
            table: SwarmTable::new(now),
            next_at: now,
            last_sent: None,
            last_written: None,
            skew_ms,
        }
    }

    /// Our heartbeat, if one is due at `now`.
    pub fn due(
        &self,
        stats: &NetStats,
        training: Option<&TrainingStatus>,
        now: u64,
    ) -> Option<Vec<u8>> {
        let spaced = self.last_sent.is_none_or(|t| now.saturating_sub(t) >= ms(MIN_HEARTBEAT_GAP));
        if now < self.next_at || !spaced {
            return None;
        }
        let hb = own_heartbeat(stats, training, now.saturating_add_signed(self.skew_ms));
        Some(heartbeat::encode(&hb))
    }

    /// The heartbeat [`Beacon::due`] returned was published (`ok`) or reached nobody;
    /// this peer sees `run_peers` other peers of its run.
    pub fn sent(&mut self, ok: bool, now: u64, run_peers: usize) {
        if ok {
            self.last_sent = Some(now);
            self.next_at = now + ms(heartbeat_every(run_peers));
        } else {
            self.next_at = now + ms(RETRY);
        }
    }

    /// A run peer connected: our next heartbeat goes out soon.
    pub fn soon(&mut self, now: u64) {
        self.next_at = self.next_at.min(now + ms(SOON));
    }

    /// A heartbeat of `author` arrived at `now`. Errors are counted in the table; returns
    /// the strike reason when the author should be penalised (bytes that are not a
    /// heartbeat; a newer wire version is no offence).
    pub fn heard(&mut self, author: PeerId, payload: &[u8], now: u64) -> Option<&'static str> {
        match heartbeat::decode(payload) {
            Ok(mut hb) => {
                // Seen from a clock `skew` ahead, the sender's clock is `skew` behind.
                hb.sent_unix_ms = hb.sent_unix_ms.saturating_add_signed(-self.skew_ms);
                self.table.heard(author, hb, now);
                None
            }
            Err(e) => {
                self.table.refused(&e);
                tracing::debug!(peer = %author, error = %e, "heartbeat refused");
                (!matches!(e, HeartbeatError::Version(_))).then_some("bad_heartbeat")
            }
        }
    }

    /// Updates our own row (shown as of now, not as of our last heartbeat), the connected
    /// peers and expiries; returns `swarm.json`'s content when it is due for writing.
    pub fn tick(
        &mut self,
        me: &PeerId,
        stats: &NetStats,
        training: Option<&TrainingStatus>,
        now: u64,
    ) -> Option<SwarmView> {
        self.table.set_own(own_heartbeat(stats, training, now.saturating_add_signed(self.skew_ms)));
        let run_peers: Vec<PeerId> =
            stats.run_peers.iter().filter_map(|p| p.parse().ok()).collect();
        self.table.connected(&run_peers, now);
        self.table.expire(now);
        if self.last_written.is_some_and(|t| now.saturating_sub(t) < ms(WRITE_EVERY)) {
            return None;
        }
        self.last_written = Some(now);
        Some(self.table.view(me, now))
    }

    /// `swarm.json`'s content now (the last one, at shutdown).
    pub fn view(&self, me: &PeerId, now: u64) -> SwarmView {
        self.table.view(me, now)
    }
}

impl<N: super::Network> super::Loop<N> {
    /// Once per status tick: our heartbeat when due, the table's upkeep, `swarm.json`.
    pub(super) async fn beat(&mut self, stats: &NetStats) {
        let now = self.clock.unix_ms();
        if let Some(bytes) = self.beacon.due(stats, Some(&self.status), now) {
            let ok = self.net.publish_heartbeat(bytes).await.is_ok();
            self.beacon.sent(ok, now, stats.run_peers.len());
        }
        let me = self.net.peer_id();
        if let Some(view) = self.beacon.tick(&me, stats, Some(&self.status), now) {
            if let Some(b) = &self.board {
                b.set_swarm(&view.peers);
            }
            self.disk.write_swarm(view);
        }
    }

    /// A run peer's heartbeat: into the table (it is only displayed and diagnosed).
    pub(super) async fn on_heartbeat(&mut self, author: PeerId, payload: &[u8]) {
        if self.allow.as_ref().is_some_and(|a| !a.contains(&author)) {
            return;
        }
        if let Some(reason) = self.beacon.heard(author, payload, self.clock.unix_ms()) {
            self.net.penalize(author, reason).await;
        }
    }
}

/// The heartbeat of a peer with these counters.
pub fn own_heartbeat(stats: &NetStats, t: Option<&TrainingStatus>, clock: u64) -> Heartbeat {
    Heartbeat {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        trains: t.is_some(),
        manifest: t.map(|t| t.run_id.clone()),
        step: t.map_or(0, |t| t.step),
        tokens_per_s: t.map_or(0.0, |t| t.tokens_per_s as f32),
        val_bpb: t.and_then(|t| t.val_bpb).map(|v| v as f32),
        rounds: t.map(|t| t.round.clone()).unwrap_or_default(),
        anchors: t
            .map(|t| {
                let short = |h: &String| h.get(..heartbeat::ANCHOR_HEX).unwrap_or(h).to_owned();
                t.anchor_hashes.iter().map(short).collect()
            })
            .unwrap_or_default(),
        merges: t.map_or(0, |t| t.merges),
        reachability: stats.reachability,
        run_peers: u16::try_from(stats.run_peers.len()).unwrap_or(u16::MAX),
        sent_unix_ms: clock,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rundir::swarm;

    #[test]
    fn heartbeats_are_spaced_and_retried() {
        let mut b = Beacon::new(1_000);
        let stats = NetStats::default();
        let first = b.due(&stats, None, 1_000).expect("due at start");
        assert!(!heartbeat::decode(&first).unwrap().trains);
        b.sent(false, 1_000, 0);
        assert!(b.due(&stats, None, 1_500).is_none(), "retried after RETRY");
        assert!(b.due(&stats, None, 2_000).is_some());
        b.sent(true, 2_000, 0);
        b.soon(2_100);
        assert!(b.due(&stats, None, 3_100).is_none(), "never closer than MIN_HEARTBEAT_GAP");
        assert!(b.due(&stats, None, 4_000).is_some());
        b.sent(true, 4_000, 3);
        assert!(b.due(&stats, None, 8_999).is_none());
        assert!(b.due(&stats, None, 9_000).is_some());
        // Among 15 other peers, one heartbeat every 16 s.
        b.sent(true, 9_000, 15);
        assert!(b.due(&stats, None, 24_999).is_none());
        assert!(b.due(&stats, None, 25_000).is_some());
    }

    #[test]
    fn a_runs_heartbeats_come_about_once_a_second_up_to_a_gap_the_table_keeps() {
        assert_eq!(heartbeat_every(0), HEARTBEAT_EVERY);
        assert_eq!(heartbeat_every(3), HEARTBEAT_EVERY);
        for n in [7, 15, 20] {
            let gap = heartbeat_every(n).as_secs_f64();
            assert!((gap - (n + 1) as f64).abs() < 1e-9, "{n} peers: {gap} s");
        }
        assert_eq!(heartbeat_every(10_000), HEARTBEAT_EVERY_MAX);
        assert_eq!(heartbeat_every(usize::MAX), HEARTBEAT_EVERY_MAX);
        let expire = Duration::from_millis(crate::heartbeat::table::EXPIRE_MS);
        assert!(HEARTBEAT_EVERY_MAX * 2 <= expire, "a live peer would leave the table");
    }

    #[test]
    fn the_table_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = Beacon::new(0);
        let (me, other) = (PeerId::random(), PeerId::random());
        let training =
            TrainingStatus { run_id: "00112233445566ff".into(), step: 7, ..Default::default() };
        let hb = own_heartbeat(&NetStats::default(), Some(&training), 500);
        assert_eq!(b.heard(other, &heartbeat::encode(&hb), 600), None);
        assert_eq!(b.heard(other, b"junk", 600), Some("bad_heartbeat"));
        let mut newer = heartbeat::encode(&hb);
        newer[4] += 1;
        assert_eq!(b.heard(other, &newer, 600), None, "a newer wire version is no offence");
        let stats = NetStats { run_peers: vec![other.to_string()], ..Default::default() };
        let view = b.tick(&me, &stats, Some(&training), 700).unwrap();
        assert!(b.tick(&me, &stats, None, 800).is_none(), "written at most once per second");
        let path = dir.path().join(swarm::FILE_NAME);
        swarm::write(&path, &view).unwrap();
        let back = swarm::read(&path).unwrap();
        assert_eq!(back, view);
        assert_eq!(back.peers[0].heartbeat.step, 7);
        assert_eq!(back.peers[0].clock_offset_ms, -100);
        assert_eq!(back.connected[0].peer, other.to_string());
        assert_eq!(back.refused.get("malformed"), Some(&1));
        assert_eq!(back.refused.get("version"), Some(&1));
        assert_eq!(back.own.unwrap().step, 7, "our own row is as of the tick");
    }
}
