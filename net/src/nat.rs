//! NAT traversal settings: AutoNAT probes, the relay server's limits and the relay client's
//! reservations.
//!
//! Most machines people lend sit behind NAT. A public measurement of libp2p hole punching
//! (arXiv 2510.27500, 4.4 M attempts) found about 70% success, for TCP and QUIC alike, so
//! about three pairs in ten need a relay for good. The pieces, all from rust-libp2p:
//! - **AutoNAT v1** tells a node whether others can dial it: a connected peer dials the
//!   node back at the IP it observed (never at an address the node names: a probe cannot
//!   aim a server at a third party) and reports the outcome.
//! - **Circuit relay v2**: a public node (by default every `--no-train` peer) serves
//!   reservations and circuits within [`RelayLimits`]; a node that found itself private
//!   reserves a slot on up to [`MAX_RESERVATIONS`] relays, and others reach it through them.
//! - **DCUtR**: over a relayed connection both ends exchange their observed addresses and
//!   dial each other at once (hole punching); when it works the relayed connection is
//!   closed and everything goes direct. The event handling is in `node::nat`.

use std::num::NonZeroU32;
use std::time::Duration;

use libp2p::{autonat, relay};

/// Relays a private node holds reservations on at once.
pub const MAX_RESERVATIONS: usize = 2;
/// Times a failed hole punch to one peer is tried again (each on a fresh circuit).
pub const MAX_PUNCH_RETRIES: u32 = 2;
/// Relay candidates (connected peers that serve the relay protocol) remembered.
pub const MAX_RELAY_CANDIDATES: usize = 16;

/// What a relay server grants. Training traffic is small next to a relay's budget: the
/// default model's delta is about 80 KiB per fragment round and a full fragment state
/// about 1.3 MiB, so a circuit may carry a few hundred MiB before it is cut and re-made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayLimits {
    /// Reservations held on this relay in all, and by one peer.
    pub max_reservations: usize,
    pub max_reservations_per_peer: usize,
    /// How long a reservation lasts before the client must renew it.
    pub reservation_duration: Duration,
    /// Circuits open at once in all, and per peer.
    pub max_circuits: usize,
    pub max_circuits_per_peer: usize,
    /// A circuit is closed after this long or this many bytes (each direction).
    pub max_circuit_duration: Duration,
    pub max_circuit_bytes: u64,
    /// New reservations and circuits a peer (or an IP) may ask for per minute.
    pub requests_per_minute: u32,
}

impl Default for RelayLimits {
    fn default() -> Self {
        RelayLimits {
            max_reservations: 128,
            max_reservations_per_peer: 4,
            reservation_duration: Duration::from_secs(3600),
            max_circuits: 64,
            max_circuits_per_peer: 8,
            max_circuit_duration: Duration::from_secs(30 * 60),
            max_circuit_bytes: 512 << 20,
            requests_per_minute: 30,
        }
    }
}

impl RelayLimits {
    /// The libp2p relay server configuration of these limits.
    pub fn server_config(&self) -> relay::Config {
        let per_minute =
            NonZeroU32::new(self.requests_per_minute.max(1)).unwrap_or(NonZeroU32::MIN);
        let minute = Duration::from_secs(60);
        relay::Config {
            max_reservations: self.max_reservations,
            max_reservations_per_peer: self.max_reservations_per_peer,
            reservation_duration: self.reservation_duration,
            max_circuits: self.max_circuits,
            max_circuits_per_peer: self.max_circuits_per_peer,
            max_circuit_duration: self.max_circuit_duration,
            max_circuit_bytes: self.max_circuit_bytes,
            // Ours replace libp2p's default rate limiters.
            reservation_rate_limiters: Vec::new(),
            circuit_src_rate_limiters: Vec::new(),
        }
        .reservation_rate_per_peer(per_minute, minute)
        .reservation_rate_per_ip(per_minute, minute)
        .circuit_src_per_peer(per_minute, minute)
        .circuit_src_per_ip(per_minute, minute)
    }
}

/// AutoNAT timings and relay limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatConfig {
    /// First reachability probe this long after start (peers must be connected by then).
    pub probe_delay: Duration,
    /// Probes while the answer is unknown or not yet confirmed.
    pub probe_retry: Duration,
    /// Probes once the answer is confirmed.
    pub probe_refresh: Duration,
    /// The relay server's limits (used when [`crate::NetConfig::relay_server`] is on).
    pub relay: RelayLimits,
}

impl Default for NatConfig {
    fn default() -> Self {
        NatConfig {
            probe_delay: Duration::from_secs(3),
            probe_retry: Duration::from_secs(15),
            probe_refresh: Duration::from_secs(5 * 60),
            relay: RelayLimits::default(),
        }
    }
}

/// AutoNAT v1 settings of `nat`.
pub fn autonat_config(nat: &NatConfig) -> autonat::Config {
    autonat::Config {
        boot_delay: nat.probe_delay,
        retry_interval: nat.probe_retry,
        refresh_interval: nat.probe_refresh,
        throttle_server_period: Duration::from_secs(5),
        // Private addresses are real in labs, LANs and tests; a server only ever dials the
        // IP it observed the client at, so allowing them does not make it a scanner.
        only_global_ips: false,
        // One answer switches the status: a relay slot costs little, waiting costs a joiner
        // minutes of being unreachable.
        confidence_max: 1,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_limits_reach_the_server_config() {
        let limits = RelayLimits { max_circuit_bytes: 7, max_circuits: 3, ..Default::default() };
        let cfg = limits.server_config();
        assert_eq!(cfg.max_circuit_bytes, 7);
        assert_eq!(cfg.max_circuits, 3);
        assert_eq!(cfg.reservation_rate_limiters.len(), 2);
        assert_eq!(cfg.circuit_src_rate_limiters.len(), 2);
        let zero = RelayLimits { requests_per_minute: 0, ..Default::default() };
        assert_eq!(zero.server_config().max_reservations, 128);
    }
}
