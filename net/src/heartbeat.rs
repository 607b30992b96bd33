//! Heartbeats: every peer of a run says, every few seconds, how it is doing, on a gossip
//! topic of its own, `atoll/<run>/heartbeat`; any one peer therefore sees the whole run.
//!
//! The peer layer does not know what a heartbeat says (the trainer encodes it); it carries
//! opaque bytes of at most [`MAX_HEARTBEAT_BYTES`], signed by their author like every gossip
//! message, and limits each *author* to a token bucket ([`HEARTBEAT_BURST`],
//! [`HEARTBEAT_RATE`]): an honest peer publishes at most one every
//! [`MIN_HEARTBEAT_GAP`], so an author over its bucket is a flooder. Its excess is dropped
//! (not forwarded, not delivered), counted under `heartbeat_rate` and given a strike.
//!
//! Why not a field of the member records (`atoll/<run>/members`)? Those are read by this
//! crate itself (addresses to dial), every 10 s; heartbeats are read by the program, twice
//! as often, and must change without touching the member wire. Both are one small signed
//! message per member per period.

use std::time::Duration;

/// Largest heartbeat on the wire.
pub const MAX_HEARTBEAT_BYTES: usize = 1024;
/// Heartbeats accepted from one author in a burst (a restart, a few run peers joining).
pub const HEARTBEAT_BURST: f64 = 5.0;
/// Heartbeats per second accepted from one author, sustained: one per
/// [`MIN_HEARTBEAT_GAP`], the most an honest peer sends.
pub const HEARTBEAT_RATE: f64 = 0.5;
/// The shortest gap between two heartbeats of an honest peer.
pub const MIN_HEARTBEAT_GAP: Duration = Duration::from_secs(2);
/// The gap between one peer's messages on a topic every one of `peers` peers of a run
/// publishes on (heartbeats, member records), so the run's messages come about once a
/// second: `peers` seconds, within `floor..=cap`. Every peer receives and forwards every
/// such message, so a fixed gap would cost each peer traffic in the run's size.
pub fn spread(peers: usize, floor: Duration, cap: Duration) -> Duration {
    let n = u32::try_from(peers).unwrap_or(u32::MAX);
    Duration::from_secs(1).saturating_mul(n).clamp(floor, cap)
}

/// Strikes for each heartbeat over an author's rate (8 ban it; an honest author never
/// exceeds its bucket).
pub const FLOOD_STRIKE: f64 = 1.0;

/// The gossipsub topic name of a run's heartbeats.
pub fn topic_name(run_name: &str) -> String {
    format!("{run_name}/h")
}
