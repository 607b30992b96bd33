//! Heartbeats: what every peer tells its run every few seconds (step, speed, `val_bpb`,
//! rounds, reachability, version, clock), so that any one peer sees the whole swarm
//! (`atoll status --swarm`) and can diagnose itself against it (`atoll doctor`).
//!
//! atoll-net carries heartbeats as opaque signed bytes on `atoll/<run>/heartbeat` (at most
//! 1 KiB, rate-limited per author); this module is their schema. The author is the gossip
//! signer, so it is not repeated inside. A stranger's heartbeat can say anything that
//! passes [`decode`]: it is displayed and used for diagnosis, never acted on.
//!
//! ```text
//! heartbeat v2 = "ATHB" version:u8=2 flags:u8 reachability:u8
//!                vlen:u8 atoll_version[vlen]              (≤ 32 bytes of [0-9A-Za-z.+_-])
//!                [manifest:8]                             (flag 2: first 8 bytes of the run id)
//!                step:u64 tokens_per_s:f32 [val_bpb:f32]  (flag 4)
//!                merges:u64 run_peers:u16 sent_unix_ms:u64
//!                nrounds:u8 round:u64 × nrounds           (≤ 64: the first 64 fragments)
//!                [anchor:6 × nrounds]                     (flag 8: each fragment state's
//!                                                          blake3, first 6 bytes)
//! flags: 1 trains, 2 manifest, 4 val_bpb, 8 anchors; integers big-endian; no trailing bytes.
//! v1 is v2 without flag 8; it is still read (an older peer's heartbeat).
//! ```
//!
//! At most 979 bytes. Every field is checked: unknown flags, a reachability out of range,
//! non-finite or absurd floats, a clock beyond year 30 000 are errors, never panics.

pub mod table;

use crate::cursor::{Cursor, Short};
use atoll_net::Reachability;
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 4] = b"ATHB";
/// Wire version of heartbeats. Bump on any change of the layout.
pub const HEARTBEAT_VERSION: u8 = 2;
/// Hex digits of a short anchor hash (6 bytes): enough to tell states apart on a page.
pub const ANCHOR_HEX: usize = 12;
/// Longest version string carried.
pub const MAX_VERSION_LEN: usize = 32;
/// Most fragment rounds carried (a run with more fragments sends its first 64).
pub const MAX_ROUNDS: usize = 64;
/// Largest `tokens_per_s` accepted (far above any peer).
pub const MAX_TOKENS_PER_S: f32 = 1e12;
/// Largest `val_bpb` accepted (a byte has 8 bits; a diverged model may do worse, not this).
pub const MAX_VAL_BPB: f32 = 1e3;
/// Latest sender clock accepted (unix ms, about year 30 000).
pub const MAX_UNIX_MS: u64 = 1 << 49;
/// Largest encoded heartbeat.
pub const MAX_ENCODED: usize =
    4 + 4 + MAX_VERSION_LEN + 8 + 8 + 4 + 4 + 8 + 2 + 8 + 1 + 8 * MAX_ROUNDS + 6 * MAX_ROUNDS;

// Every heartbeat fits atoll-net's limit for the topic.
const _: () = assert!(MAX_ENCODED <= atoll_net::heartbeat::MAX_HEARTBEAT_BYTES);

const FLAG_TRAINS: u8 = 1;
const FLAG_MANIFEST: u8 = 2;
const FLAG_VAL_BPB: u8 = 4;
const FLAG_ANCHORS: u8 = 8;
const KNOWN_FLAGS: u8 = FLAG_TRAINS | FLAG_MANIFEST | FLAG_VAL_BPB | FLAG_ANCHORS;

/// One peer's heartbeat, as it claims it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The sender's atoll version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// The sender trains (a `--no-train` peer does not).
    pub trains: bool,
    /// Short run id of the sender's manifest (16 hex digits); `None` without a manifest.
    pub manifest: Option<String>,
    /// Inner steps taken.
    pub step: u64,
    pub tokens_per_s: f32,
    /// Validation bits per byte of its latest pass.
    pub val_bpb: Option<f32>,
    /// Round of each fragment's state (the first [`MAX_ROUNDS`]).
    pub rounds: Vec<u64>,
    /// Each of those states' short hash ([`ANCHOR_HEX`] hex digits of its blake3), so a
    /// peer can tell whether the swarm agrees; empty when not sent (a v1 peer, a relay).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anchors: Vec<String>,
    /// Merges so far.
    pub merges: u64,
    /// Whether others can dial it (AutoNAT), as it believes.
    pub reachability: Reachability,
    /// Run peers it is connected to.
    pub run_peers: u16,
    /// The sender's wall clock when it sent this (unix ms): the receiver compares it with
    /// its own to find clocks that disagree.
    pub sent_unix_ms: u64,
}

/// Why bytes are not a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeartbeatError {
    #[error("heartbeat of {0} bytes is larger than any valid one ({MAX_ENCODED})")]
    TooLarge(usize),
    #[error("not a heartbeat (no ATHB magic)")]
    Magic,
    #[error("heartbeat wire version {0}, this peer reads {HEARTBEAT_VERSION}")]
    Version(u8),
    #[error("heartbeat truncated")]
    Truncated,
    #[error("{0} trailing bytes after the heartbeat")]
    Trailing(usize),
    #[error("invalid heartbeat field: {0}")]
    Field(&'static str),
}

/// A peer id for people: its last 8 characters (libp2p ids share their first ones).
pub fn short_peer(peer: &str) -> String {
    let start = peer.char_indices().rev().nth(7).map_or(0, |(i, _)| i);
    format!("…{}", &peer[start..])
}

/// `2N` hex digits (a short run id, a short anchor hash) as N bytes, if they are.
fn hex_bytes<const N: usize>(hex: &str) -> Option<[u8; N]> {
    if hex.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn version_ok(v: &str) -> bool {
    v.len() <= MAX_VERSION_LEN
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'_' | b'-'))
}

fn float_ok(v: f32, max: f32) -> bool {
    v.is_finite() && (0.0..=max).contains(&v)
}

/// Encodes a heartbeat. Values outside what [`decode`] accepts are clamped or left out
/// (an over-long version is cut, extra rounds dropped), so a peer never sends one its
/// peers refuse.
pub fn encode(hb: &Heartbeat) -> Vec<u8> {
    let mut version: String = hb
        .version
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '_' | '-'))
        .collect();
    version.truncate(MAX_VERSION_LEN);
    let manifest = hb.manifest.as_deref().and_then(hex_bytes::<8>);
    let anchors = anchor_bytes(&hb.anchors, hb.rounds.len().min(MAX_ROUNDS));
    let val_bpb = hb.val_bpb.filter(|v| float_ok(*v, MAX_VAL_BPB));
    let mut flags = 0;
    if hb.trains {
        flags |= FLAG_TRAINS;
    }
    if manifest.is_some() {
        flags |= FLAG_MANIFEST;
    }
    if val_bpb.is_some() {
        flags |= FLAG_VAL_BPB;
    }
    if anchors.is_some() {
        flags |= FLAG_ANCHORS;
    }
    let mut out = Vec::with_capacity(MAX_ENCODED);
    out.extend_from_slice(MAGIC);
    out.push(HEARTBEAT_VERSION);
    out.push(flags);
    out.push(reach_tag(hb.reachability));
    out.push(version.len() as u8);
    out.extend_from_slice(version.as_bytes());
    if let Some(m) = manifest {
        out.extend_from_slice(&m);
    }
    out.extend_from_slice(&hb.step.to_be_bytes());
    let tps = if float_ok(hb.tokens_per_s, MAX_TOKENS_PER_S) { hb.tokens_per_s } else { 0.0 };
    out.extend_from_slice(&tps.to_be_bytes());
    if let Some(v) = val_bpb {
        out.extend_from_slice(&v.to_be_bytes());
    }
    out.extend_from_slice(&hb.merges.to_be_bytes());
    out.extend_from_slice(&hb.run_peers.to_be_bytes());
    out.extend_from_slice(&hb.sent_unix_ms.min(MAX_UNIX_MS).to_be_bytes());
    let rounds = &hb.rounds[..hb.rounds.len().min(MAX_ROUNDS)];
    out.push(rounds.len() as u8);
    for r in rounds {
        out.extend_from_slice(&r.to_be_bytes());
    }
    if let Some(anchors) = anchors {
        out.extend(anchors.iter().flatten());
    }
    out
}

/// The first `n` short anchor hashes as bytes, if there are `n` and each is one.
fn anchor_bytes(anchors: &[String], n: usize) -> Option<Vec<[u8; 6]>> {
    if n == 0 || anchors.len() < n {
        return None;
    }
    anchors[..n].iter().map(|a| hex_bytes::<6>(a.get(..ANCHOR_HEX)?)).collect()
}

fn reach_tag(r: Reachability) -> u8 {
    match r {
        Reachability::Unknown => 0,
        Reachability::Public => 1,
        Reachability::Private => 2,
    }
}

impl From<Short> for HeartbeatError {
    fn from(_: Short) -> Self {
        HeartbeatError::Truncated
    }
}

/// Decodes and checks a heartbeat. Never panics; allocates at most [`MAX_ENCODED`] bytes'
/// worth, after the length check.
pub fn decode(bytes: &[u8]) -> Result<Heartbeat, HeartbeatError> {
    if bytes.len() > MAX_ENCODED {
        return Err(HeartbeatError::TooLarge(bytes.len()));
    }
    let mut r = Cursor::new(bytes);
    if r.take(4).map_err(|_| HeartbeatError::Magic)? != MAGIC {
        return Err(HeartbeatError::Magic);
    }
    let wire = r.u8()?;
    if wire != HEARTBEAT_VERSION && wire != 1 {
        return Err(HeartbeatError::Version(wire));
    }
    let flags = r.u8()?;
    let known = if wire == 1 { KNOWN_FLAGS & !FLAG_ANCHORS } else { KNOWN_FLAGS };
    if flags & !known != 0 {
        return Err(HeartbeatError::Field("unknown flags"));
    }
    let reachability = match r.u8()? {
        0 => Reachability::Unknown,
        1 => Reachability::Public,
        2 => Reachability::Private,
        _ => return Err(HeartbeatError::Field("reachability")),
    };
    let vlen = r.u8()? as usize;
    if vlen > MAX_VERSION_LEN {
        return Err(HeartbeatError::Field("version length"));
    }
    let version = std::str::from_utf8(r.take(vlen)?)
        .ok()
        .filter(|v| version_ok(v))
        .ok_or(HeartbeatError::Field("version"))?
        .to_owned();
    let manifest = if flags & FLAG_MANIFEST != 0 {
        Some(r.array::<8>()?.iter().map(|b| format!("{b:02x}")).collect())
    } else {
        None
    };
    let step = r.u64_be()?;
    let tokens_per_s = r.f32_be()?;
    if !float_ok(tokens_per_s, MAX_TOKENS_PER_S) {
        return Err(HeartbeatError::Field("tokens_per_s"));
    }
    let val_bpb = if flags & FLAG_VAL_BPB != 0 {
        let v = r.f32_be()?;
        if !float_ok(v, MAX_VAL_BPB) {
            return Err(HeartbeatError::Field("val_bpb"));
        }
        Some(v)
    } else {
        None
    };
    let merges = r.u64_be()?;
    let run_peers = r.u16_be()?;
    let sent_unix_ms = r.u64_be()?;
    if sent_unix_ms > MAX_UNIX_MS {
        return Err(HeartbeatError::Field("sent_unix_ms"));
    }
    let n = r.u8()? as usize;
    if n > MAX_ROUNDS {
        return Err(HeartbeatError::Field("round count"));
    }
    let rounds = (0..n).map(|_| r.u64_be()).collect::<Result<Vec<u64>, _>>()?;
    let anchors = if flags & FLAG_ANCHORS != 0 {
        if n == 0 {
            return Err(HeartbeatError::Field("anchors without rounds"));
        }
        let hex = |a: [u8; 6]| a.iter().map(|b| format!("{b:02x}")).collect::<String>();
        (0..n).map(|_| r.array::<6>().map(hex)).collect::<Result<Vec<String>, _>>()?
    } else {
        Vec::new()
    };
    if r.remaining() > 0 {
        return Err(HeartbeatError::Trailing(r.remaining()));
    }
    Ok(Heartbeat {
        version,
        trains: flags & FLAG_TRAINS != 0,
        manifest,
        step,
        tokens_per_s,
        val_bpb,
        rounds,
        anchors,
        merges,
        reachability,
        run_peers,
        sent_unix_ms,
    })
}

#[cfg(test)]
mod tests;
