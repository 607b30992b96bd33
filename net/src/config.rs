//! Node configuration: what a caller sets, validated once at start.

use std::path::PathBuf;
use std::time::Duration;

use libp2p::identity::Keypair;
use libp2p::kad::RecordKey;
use libp2p::Multiaddr;

use crate::blob::store::DEFAULT_STORE_BUDGET;
use crate::error::NetError;

/// Run id used when none is given: every peer started without `--run-id` joins this swarm.
pub const DEFAULT_RUN_ID: &str = "atoll-default";
/// Longest run id (it appears in the gossip topic and the envelope).
pub const MAX_RUN_ID_LEN: usize = 64;
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
    pub run_id: String,
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
}

impl std::fmt::Debug for NetConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetConfig")
            .field("peer_id", &self.keypair.public().to_peer_id())
            .field("run_id", &self.run_id)
            .field("listen", &self.listen)
            .field("bootstrap", &self.bootstrap)
            .field("mdns", &self.mdns)
            .field("max_upload_bytes_per_sec", &self.max_upload_bytes_per_sec)
            .field("store_budget", &self.store_budget)
            .field("block_list", &self.block_list)
            .finish_non_exhaustive()
    }
}

impl NetConfig {
    /// Defaults: no listen address, no bootstrap, mDNS off, no cap, 1 GiB store.
    pub fn new(keypair: Keypair, run_id: impl Into<String>) -> Self {
        NetConfig {
            keypair,
            run_id: run_id.into(),
            listen: Vec::new(),
            bootstrap: Vec::new(),
            mdns: false,
            max_upload_bytes_per_sec: None,
            store_budget: DEFAULT_STORE_BUDGET,
            discovery_interval: DEFAULT_DISCOVERY_INTERVAL,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            block_list: None,
        }
    }

    /// Rejects settings that cannot work, with a message a person can act on.
    pub fn validate(&self) -> Result<(), NetError> {
        validate_run_id(&self.run_id)?;
        if self.discovery_interval < Duration::from_millis(100) {
            return Err(NetError::Config("discovery interval below 100 ms".into()));
        }
        if self.request_timeout < Duration::from_secs(1) {
            return Err(NetError::Config("request timeout below 1 s".into()));
        }
        Ok(())
    }
}

/// Run ids are short and plain: letters, digits, `.`, `_`, `-`.
pub fn validate_run_id(run_id: &str) -> Result<(), NetError> {
    let ok_chars =
        run_id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if run_id.is_empty() || run_id.len() > MAX_RUN_ID_LEN || !ok_chars {
        return Err(NetError::Config(format!(
            "run id {run_id:?} must be 1 to {MAX_RUN_ID_LEN} characters of [A-Za-z0-9._-]"
        )));
    }
    Ok(())
}

/// The DHT key every peer of `run_id` provides: `blake3("atoll/run/" + run_id)`.
pub fn run_key(run_id: &str) -> RecordKey {
    let h = blake3::hash(format!("atoll/run/{run_id}").as_bytes());
    RecordKey::new(&h.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_checked() {
        assert!(validate_run_id(DEFAULT_RUN_ID).is_ok());
        assert!(validate_run_id("a/b").is_err());
        assert!(validate_run_id("").is_err());
        assert!(validate_run_id(&"x".repeat(65)).is_err());
        assert_ne!(run_key("a").to_vec(), run_key("b").to_vec());
    }
}
