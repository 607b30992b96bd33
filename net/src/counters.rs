//! Counters on the hot paths and the [`NetStats`] snapshot that the status file shows.
//!
//! Byte counters that connection tasks touch are atomics behind one `Arc`; everything else
//! (per-peer bytes, rejects) belongs to the swarm task alone and needs no lock.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::streamkind::StreamKind;

/// Sent and received bytes of one protocol, one peer or the whole node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteCount {
    pub sent: u64,
    pub received: u64,
}

/// A pair of atomic byte counters.
#[derive(Debug, Default)]
pub struct ByteCounter {
    sent: AtomicU64,
    received: AtomicU64,
}

impl ByteCounter {
    pub fn add_out(&self, n: u64) {
        self.sent.fetch_add(n, Ordering::Relaxed);
    }
    pub fn add_in(&self, n: u64) {
        self.received.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> ByteCount {
        ByteCount {
            sent: self.sent.load(Ordering::Relaxed),
            received: self.received.load(Ordering::Relaxed),
        }
    }
}

/// Counters shared between the swarm task and the connection tasks.
#[derive(Debug, Default)]
pub struct Counters {
    /// Every byte on every substream of every connection (all protocols, after the muxer,
    /// before encryption framing), TCP and QUIC alike.
    pub transport: ByteCounter,
    /// Bytes of the blob protocol (requests and responses as encoded).
    pub blob: ByteCounter,
    /// Announcement payloads published and received (gossipsub framing excluded).
    pub announce: ByteCounter,
    /// Raw bytes of relayed connections (circuits), as the relay carried them.
    pub relayed: ByteCounter,
    /// The bytes of [`Counters::transport`] by the protocol of their substream, indexed by
    /// [`StreamKind::index`].
    pub streams: [ByteCounter; StreamKind::ALL.len()],
    /// Inbound blob requests that failed to decode. Counted in the codec, which does not
    /// know the peer (request-response does not report read failures upward).
    pub blob_malformed: AtomicU64,
    /// Whether a malformed blob request was logged yet (logged once per node).
    pub blob_malformed_logged: AtomicBool,
}

/// Why a message, connection or transfer was refused. Counted and logged once per peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum RejectReason {
    /// Announcement larger than the limit.
    Oversized,
    /// Announcement that does not decode.
    Malformed,
    /// Announcement of another run.
    WrongRun,
    /// Announcement of another protocol version.
    WrongVersion,
    /// Inbound connection that failed the handshake (garbage on the listen port).
    Handshake,
    /// Blob stream that failed to decode (garbage on the blob protocol).
    BlobMalformed,
    /// A chunk list that does not hash to the blob it was asked for.
    BadChunkList,
    /// A chunk that does not match the chunk list.
    BadChunk,
    /// Peer that speaks another atoll wire version (identify).
    PeerVersion,
    /// A payload the protocol layer found invalid (bad shapes, non-finite values, ...),
    /// reported through [`crate::NetClient::report`].
    BadPayload,
    /// Announcement over the per-source rate limit (ignored, not penalised).
    RateLimited,
    /// Inbound connection over the per-IP cap.
    IpLimit,
    /// Blob transfer hygiene: a chunk request for a chunk already served to this peer
    /// recently (answered `Busy`).
    RepeatRequest,
    /// Blob transfer hygiene: a blob request beyond the peer's fair share of our uploads
    /// (answered `Busy`).
    OverShare,
    /// A peer not on the run's allow list (disconnected).
    NotAllowed,
    /// A heartbeat over its author's rate limit (dropped; the author gets a strike).
    HeartbeatRate,
}

impl RejectReason {
    /// Stable name used in the status file and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::Oversized => "oversized",
            RejectReason::Malformed => "malformed",
            RejectReason::WrongRun => "wrong_run",
            RejectReason::WrongVersion => "wrong_version",
            RejectReason::Handshake => "handshake",
            RejectReason::BlobMalformed => "blob_malformed",
            RejectReason::BadChunkList => "bad_chunk_list",
            RejectReason::BadChunk => "bad_chunk",
            RejectReason::PeerVersion => "peer_version",
            RejectReason::BadPayload => "bad_payload",
            RejectReason::RateLimited => "rate_limited",
            RejectReason::IpLimit => "ip_limit",
            RejectReason::RepeatRequest => "repeat_request",
            RejectReason::OverShare => "over_share",
            RejectReason::NotAllowed => "not_allowed",
            RejectReason::HeartbeatRate => "heartbeat_rate",
        }
    }

    /// True for reasons that mean the peer lied or attacked (its data must not be trusted).
    pub fn is_penalty(self) -> bool {
        matches!(
            self,
            RejectReason::BadChunkList | RejectReason::BadChunk | RejectReason::BadPayload
        )
    }
}

/// A snapshot of the node, as written to `status.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NetStats {
    pub peer_id: String,
    pub run_name: String,
    /// Addresses this node listens on, each ending in `/p2p/<peer_id>` (ready to bootstrap from).
    pub listen_addrs: Vec<String>,
    /// Peer ids of the run's peers this node is connected to, sorted.
    pub run_peers: Vec<String>,
    /// Number of connected peers (of any run).
    pub connected: usize,
    /// Peers in the Kademlia routing table.
    pub routing_table_size: usize,
    /// All substream bytes (see [`Counters::transport`]).
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Bytes per protocol: "transport" (every substream byte), "blob" and "announce"
    /// (payloads as encoded), and "stream/<family>" (the substream bytes of one protocol
    /// family, framing included: "stream/gossipsub", "stream/kad", ...).
    pub protocols: BTreeMap<String, ByteCount>,
    /// Blob and announcement payload bytes per peer (bounded to the most recent peers).
    pub peers: BTreeMap<String, ByteCount>,
    /// Rejected messages and connections by reason.
    pub rejects: BTreeMap<String, u64>,
    /// Events dropped because the consumer of the event stream fell behind.
    pub events_dropped: u64,
    /// Blobs and bytes in the local store.
    pub blobs_stored: usize,
    pub store_bytes: u64,
    /// Peers currently penalised for serving bad data.
    pub penalised: usize,
    /// Seconds since the node started.
    pub uptime_secs: u64,
    /// Peers banned for the run (loaded from the ban file or banned since).
    #[serde(default)]
    pub banned: usize,
    /// Strikes given by reason: [`crate::NetClient::penalize`] reasons, penalising reports
    /// and announcements net itself rejected.
    #[serde(default)]
    pub strikes: BTreeMap<String, u64>,
    /// The peers with the most standing strikes (not banned), most first: who misbehaves
    /// now, by id (at most [`crate::bans::SHOWN_PEERS`]).
    #[serde(default)]
    pub struck: Vec<StruckPeer>,
    /// The latest peers banned in this run, newest last, each with the reason of the strike
    /// that banned it (at most [`crate::bans::SHOWN_PEERS`]; `banned` counts them all).
    #[serde(default)]
    pub recent_bans: Vec<BannedPeer>,
    /// Log lines about remote peers left out by the per-(peer, reason) throttle.
    #[serde(default)]
    pub log_suppressed: u64,
    /// Dials started to peers found as providers of the run key (bounded per tick).
    #[serde(default)]
    pub provider_dials: u64,
    // Blob transfer hygiene
    /// Blob requests refused per requesting peer (repeats and over fair share), for peers
    /// still tracked by the fair share (bounded); counted by reason in `rejects`.
    #[serde(default)]
    pub upload_refusals: BTreeMap<String, u64>,
    /// Chunk requests this node sent to a second holder because the first was slow.
    #[serde(default)]
    pub hedged_requests: u64,
    /// Times a source missed its per-request deadline and was demoted in a fetch.
    #[serde(default)]
    pub slow_sources: u64,
    // NAT traversal
    /// Whether others can dial this node, as AutoNAT probes found.
    #[serde(default)]
    pub reachability: Reachability,
    /// How this node reaches each connected run peer (sorted by peer id).
    #[serde(default)]
    pub links: Vec<PeerLink>,
    /// The relay side: reservations held on other peers, and what this node relays.
    #[serde(default)]
    pub relay: RelayStats,
    // Configuration the diagnosis needs (`atoll doctor`)
    /// Bootstrap addresses this node was started with.
    #[serde(default)]
    pub bootstrap: Vec<String>,
    /// The upload cap on blob payloads in bytes per second (`None`: no cap).
    #[serde(default)]
    pub max_upload_bytes_per_sec: Option<u64>,
    /// The most recent failed dials, oldest first (bounded): what a peer that reaches no
    /// one tried, and why each attempt failed.
    #[serde(default)]
    pub dial_failures: Vec<DialFailure>,
}

/// A peer with standing strikes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StruckPeer {
    pub peer: String,
    /// Standing strikes (they fade by one per [`crate::bans::STRIKE_DECAY`]; a peer is
    /// banned at [`crate::bans::BAN_STRIKES`]).
    pub strikes: f64,
}

/// A peer banned in this run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BannedPeer {
    pub peer: String,
    /// The reason of the strike that banned it (`bad_delta`, `unserved`, `malformed`, ...).
    pub reason: String,
    /// When, in seconds since the node started.
    pub at_secs: u64,
}

/// One address a dial tried, and why it failed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DialFailure {
    /// The peer dialled, when known.
    pub peer: Option<String>,
    /// The address tried ("" when libp2p did not name one).
    pub addr: String,
    /// libp2p's error with its causes (bounded).
    pub error: String,
    /// When, in seconds since the node started.
    pub at_secs: u64,
}

/// Whether other peers can dial this node (AutoNAT).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reachability {
    /// Not probed yet, or no probe could be made (no server peer to ask).
    #[default]
    Unknown,
    /// Peers dialled one of our addresses back.
    Public,
    /// Dial-backs failed: behind NAT or a firewall; reachable only through a relay.
    Private,
}

/// How a run peer is connected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkKind {
    /// A direct connection (dialled, accepted, or upgraded by hole punching).
    #[default]
    Direct,
    /// Only through a relay (circuit relay v2).
    Relayed,
}

/// One connected run peer and its link.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerLink {
    pub peer: String,
    pub kind: LinkKind,
    /// The remote address of the connection used.
    pub addr: String,
}

/// Relay client and server figures.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayStats {
    /// This node runs a relay server (public `--no-train` peers by default).
    pub serving: bool,
    /// Peers holding a reservation on this node's relay.
    pub reservations_served: usize,
    /// Circuits this node's relay accepted in all.
    pub circuits_served: u64,
    /// Bytes this node sent and received through relay circuits as an endpoint (encrypted
    /// and framed: what the relay carried for it).
    pub circuit_bytes: ByteCount,
    /// Relays this node holds a reservation on (peer ids), i.e. where others can reach it.
    pub reservations: Vec<String>,
    /// Relayed connections upgraded to direct ones by hole punching, and failed attempts.
    pub holepunch_ok: u64,
    pub holepunch_failed: u64,
}
