//! Node configuration: what a caller sets, validated once at start.

use std::path::PathBuf;
use std::time::Duration;

use libp2p::identity::Keypair;
use libp2p::kad::RecordKey;
use libp2p::Multiaddr;

use crate::blob::store::DEFAULT_STORE_BUDGET;
use crate::error::NetError;
use crate::iplimit::DEFAULT_MAX_CONNECTIONS_PER_IP;
use crate::limiter::share::FairShareConfig;
use crate::nat::NatConfig;
use crate::swarmkey;

/// Run id used when none is given: every peer started without `--run-id` joins this swarm.
pub const DEFAULT_RUN_NAME: &str = "atoll-default";
/// Longest run name (it appears in the gossip topic and the envelope).
pub const MAX_RUN_NAME_LEN: usize = 64;
/// Default period of provider lookups (discovery of newcomers).
pub const DEFAULT_DISCOVERY_INTERVAL: Duration = Duration::from_secs(3);
/// Default timeout of one blob request (covers waiting in a capped uploader's queue).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections without traffic are kept this long: run peers stay connected.
pub const IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(300);

/// Everything needed to start a node.
#[derive(Clone)]
pub struct NetConfig {
    /// The peer's identity (see [`crate::identity::load_or_create`]).
    pub keypair: Keypair,
    /// Which swarm to join; peers of other runs are never counted as run peers.
    pub run_name: String,
    /// The blob hash of the run's manifest (the program's run id), told to every peer in
    /// identify (see [`crate::advert`]) so that a joiner learns which run we serve before
    /// it fetches the manifest from us. `None`: not told.
    pub manifest: Option<crate::BlobHash>,
    /// Addresses to listen on, e.g. `/ip4/127.0.0.1/tcp/0`, `/ip4/0.0.0.0/udp/0/quic-v1`.
    pub listen: Vec<Multiaddr>,
    /// Peers to dial at start (with `/p2p/<peer id>` or without).
    pub bootstrap: Vec<Multiaddr>,
    /// Discover peers on the LAN by multicast DNS. Off in tests (traffic leaves loopback).
    pub mdns: bool,
    /// Upload cap on blob payloads in bytes per second; `None` = unlimited.
    pub max_upload_bytes_per_sec: Option<u64>,
    /// Byte budget of the local blob store.
    pub store_budget: u64,
    /// Period of provider lookups and re-bootstraps.
    pub discovery_interval: Duration,
    /// Timeout of one blob request.
    pub request_timeout: Duration,
    /// Fault injection (tests only): peers listed in this file are refused and
    /// disconnected; see [`crate::fault`]. `None` in normal runs.
    pub block_list: Option<PathBuf>,
    /// A closed run: only these peers may stay connected (others are disconnected as soon
    /// as their connection is established, and counted as `not_allowed`). `None`: anyone.
    pub allow: Option<std::collections::HashSet<libp2p::PeerId>>,
    /// Peers banned for misbehaving are kept here (one peer id per line), loaded at start
    /// and rewritten on each ban; `None` keeps bans in memory for this process only.
    pub ban_file: Option<PathBuf>,
    /// Most established inbound connections (and most handshakes in progress) from one
    /// remote host (IPv4 address, IPv6 /64); its network (/24, /48) may hold 4× that. See
    /// [`crate::iplimit`].
    pub max_connections_per_ip: u32,
    /// Loopback peers are exempt from the per-IP cap, and from gossipsub's IP colocation
    /// penalty when this node listens on loopback (local swarms and tests run many peers
    /// on 127.0.0.1). Tests of the caps turn it off.
    pub exempt_loopback: bool,
    /// Private swarm: the 32-byte pre-shared key every peer must hold (libp2p pnet over
    /// TCP; QUIC addresses are then refused). Parse a `swarm.key` file with
    /// [`crate::swarmkey::load`].
    pub swarm_key: Option<[u8; 32]>,
    // Blob transfer hygiene
    /// Per-requester fair share of our uploads: repeat refusal and a byte budget per
    /// window; see [`crate::limiter::share`].
    pub upload_share: FairShareConfig,
    // NAT traversal
    /// Serve circuit relay v2 (reservations and circuits within `nat.relay`): on for public
    /// bootstrap peers. Every node is a relay client and hole-punches anyway.
    pub relay_server: bool,
    /// AutoNAT timings and the relay server's limits.
    pub nat: NatConfig,
}

impl std::fmt::Debug for NetConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetConfig")
            .field("peer_id", &self.keypair.public().to_peer_id())
            .field("run_name", &self.run_name)
            .field("listen", &self.listen)
            .field("bootstrap", &self.bootstrap)
            .field("mdns", &self.mdns)
            .field("max_upload_bytes_per_sec", &self.max_upload_bytes_per_sec)
            .field("store_budget", &self.store_budget)
            .field("block_list", &self.block_list)
            .field("ban_file", &self.ban_file)
            .field("max_connections_per_ip", &self.max_connections_per_ip)
            .field("exempt_loopback", &self.exempt_loopback)
            .field("swarm_key", &self.swarm_key.map(|_| "<set>"))
            .field("relay_server", &self.relay_server)
            .finish_non_exhaustive()
    }
}

impl NetConfig {
    /// Defaults: no listen address, no bootstrap, mDNS off, no cap, 1 GiB store.
    pub fn new(keypair: Keypair, run_name: impl Into<String>) -> Self {
        NetConfig {
            keypair,
            run_name: run_name.into(),
            manifest: None,
            listen: Vec::new(),
            bootstrap: Vec::new(),
            mdns: false,
            max_upload_bytes_per_sec: None,
            store_budget: DEFAULT_STORE_BUDGET,
            discovery_interval: DEFAULT_DISCOVERY_INTERVAL,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            block_list: None,
            allow: None,
            ban_file: None,
            max_connections_per_ip: DEFAULT_MAX_CONNECTIONS_PER_IP,
            exempt_loopback: true,
            swarm_key: None,
            upload_share: FairShareConfig::default(),
            relay_server: false,
            nat: NatConfig::default(),
        }
    }

    /// Rejects settings that cannot work, with a message a person can act on.
    pub fn validate(&self) -> Result<(), NetError> {
        validate_run_name(&self.run_name)?;
        if self.discovery_interval < Duration::from_millis(100) {
            return Err(NetError::Config("discovery interval below 100 ms".into()));
        }
        if self.request_timeout < Duration::from_secs(1) {
            return Err(NetError::Config("request timeout below 1 s".into()));
        }
        if self.max_connections_per_ip == 0 {
            return Err(NetError::Config("max connections per IP must be at least 1".into()));
        }
        if self.swarm_key.is_some() {
            if let Some(a) = self.listen.iter().find(|a| swarmkey::is_quic(a)) {
                return Err(swarmkey::quic_refused(a, true));
            }
            if let Some(a) = self.bootstrap.iter().find(|a| swarmkey::is_quic(a)) {
                return Err(swarmkey::quic_refused(a, false));
            }
        }
        Ok(())
    }
}

/// Run ids are short and plain: letters, digits, `.`, `_`, `-`.
pub fn validate_run_name(run_name: &str) -> Result<(), NetError> {
    let ok_chars =
        run_name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if run_name.is_empty() || run_name.len() > MAX_RUN_NAME_LEN || !ok_chars {
        return Err(NetError::Config(format!(
            "run name {run_name:?} must be 1 to {MAX_RUN_NAME_LEN} characters of [A-Za-z0-9._-]"
        )));
    }
    Ok(())
}

/// The DHT key every peer of `run_name` provides: `blake3("atoll/run/" + run_name)`.
pub fn run_key(run_name: &str) -> RecordKey {
    let h = blake3::hash(format!("atoll/run/{run_name}").as_bytes());
    RecordKey::new(&h.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_names_are_checked() {
        assert!(validate_run_name(DEFAULT_RUN_NAME).is_ok());
        assert!(validate_run_name("a/b").is_err());
        assert!(validate_run_name("").is_err());
        assert!(validate_run_name(&"x".repeat(65)).is_err());
        assert_ne!(run_key("a").to_vec(), run_key("b").to_vec());
    }

    #[test]
    fn a_swarm_key_refuses_quic_with_the_reason() {
        let mut cfg = NetConfig::new(Keypair::generate_ed25519(), "r");
        cfg.listen.push("/ip4/127.0.0.1/udp/0/quic-v1".parse().unwrap());
        assert!(cfg.validate().is_ok());
        cfg.swarm_key = Some([1; 32]);
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("QUIC") && err.contains("swarm key"), "{err}");
    }
}
