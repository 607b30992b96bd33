//! The composed libp2p behaviour and its protocol settings.

pub mod scoring;

use std::sync::Arc;
use std::time::Duration;

use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::NetworkBehaviour;
use libp2p::{
    allow_block_list, autonat, connection_limits, dcutr, gossipsub, identify, identity::Keypair,
    kad, mdns, ping, relay, request_response,
};
use libp2p::{PeerId, StreamProtocol};

use crate::addr;
use crate::announce::{topic_name, GOSSIP_MAX_TRANSMIT};
use crate::blob::wire::{BlobCodec, BLOB_PROTOCOL};
use crate::config::NetConfig;
use crate::counters::Counters;
use crate::error::NetError;
use crate::iplimit::IpLimits;

/// Kademlia protocol name: our own DHT, never merged with the public IPFS one.
pub const KAD_PROTOCOL: StreamProtocol = StreamProtocol::new("/atoll/kad/1.0.0");
/// Identify protocol version: the generation of atoll's wire formats (2: binary gossip
/// announcements; 3: two-byte gossip envelopes and short topic names; 4: state
/// announcements that name their parent, message version 3). Peers announcing another one
/// are counted and ignored (they would refuse each other's messages as malformed).
pub const IDENTIFY_PROTOCOL_VERSION: &str = "/atoll/4.0.0";
/// Concurrent blob streams per connection (bounds memory of in-flight chunks).
pub const MAX_BLOB_STREAMS: usize = 64;

/// How often each connection is pinged.
pub const PING_INTERVAL: Duration = Duration::from_secs(3);
/// A ping not answered within this long fails; libp2p reports the second failure in a
/// row (the retry opens a new stream, which may take the 10 s negotiation timeout), and
/// the connection is then closed as dead (see `swarm_events`). A peer behind a silent
/// partition (packets dropped, TCP never resets) is dropped about half a minute after it
/// went quiet (close timeout included), instead of the ~15 min TCP takes to give up on
/// unacknowledged data. Not shorter: a healthy connection whose uplink is saturated by blob
/// transfers queues the ping behind them, and must not be cut.
pub const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections to one peer (two simultaneous dials plus one spare).
pub const MAX_CONNECTIONS_PER_PEER: u32 = 3;
/// Incoming connections still in their handshake; half of them are kept for networks with
/// none in progress ([`crate::iplimit`]).
pub const MAX_PENDING_INCOMING: u32 = 64;
/// Established connections in all.
pub const MAX_CONNECTIONS: u32 = 512;

/// All protocols of a node.
#[derive(NetworkBehaviour)]
pub struct Behaviour {
    /// Refuses banned peers and, with fault injection ([`NetConfig::block_list`]), listed
    /// ones, on dial and accept (the swarm task keeps the two sets apart; see
    /// `node::hygiene`). First, so that a refused connection is never offered to the others.
    pub blocked: allow_block_list::Behaviour<allow_block_list::BlockedPeers>,
    /// Caps inbound connections per remote IP ([`crate::iplimit`]).
    pub ip_limits: IpLimits,
    pub limits: connection_limits::Behaviour,
    pub kad: kad::Behaviour<kad::store::MemoryStore>,
    pub identify: identify::Behaviour,
    pub ping: ping::Behaviour,
    pub gossipsub: gossipsub::Behaviour,
    pub blob: request_response::Behaviour<BlobCodec>,
    pub mdns: Toggle<mdns::tokio::Behaviour>,
    /// AutoNAT (v1): connected peers dial us back to tell whether we are reachable, and we
    /// do the same for them (see `node::nat`).
    pub autonat: autonat::Behaviour,
    /// Circuit relay v2 server, with the limits of [`crate::nat::RelayLimits`] (public
    /// `--no-train` peers by default).
    pub relay: Toggle<relay::Behaviour>,
    /// Circuit relay v2 client: reservations on relays while we are private, and dials
    /// through them.
    pub relay_client: relay::client::Behaviour,
    /// Hole punching: upgrades a relayed connection to a direct one.
    pub dcutr: dcutr::Behaviour,
}

impl Behaviour {
    pub fn new(
        key: &Keypair,
        cfg: &NetConfig,
        counters: Arc<Counters>,
        relay_client: relay::client::Behaviour,
    ) -> Result<Self, NetError> {
        let peer_id = key.public().to_peer_id();
        Ok(Behaviour {
            blocked: allow_block_list::Behaviour::default(),
            ip_limits: IpLimits::new(
                cfg.max_connections_per_ip,
                cfg.exempt_loopback,
                MAX_PENDING_INCOMING,
            ),
            limits: connection_limits::Behaviour::new(
                connection_limits::ConnectionLimits::default()
                    .with_max_established_per_peer(Some(MAX_CONNECTIONS_PER_PEER))
                    .with_max_pending_incoming(Some(MAX_PENDING_INCOMING))
                    .with_max_established(Some(MAX_CONNECTIONS)),
            ),
            kad: kademlia(peer_id),
            identify: identify::Behaviour::new(
                identify::Config::new(IDENTIFY_PROTOCOL_VERSION.into(), key.public())
                    .with_agent_version(crate::advert::agent_version(cfg.manifest))
                    .with_push_listen_addr_updates(true),
            ),
            ping: ping::Behaviour::new(
                ping::Config::new().with_interval(PING_INTERVAL).with_timeout(PING_TIMEOUT),
            ),
            gossipsub: gossip(key, cfg)?,
            blob: request_response::Behaviour::with_codec(
                BlobCodec { counters },
                [(BLOB_PROTOCOL, request_response::ProtocolSupport::Full)],
                request_response::Config::default()
                    .with_request_timeout(cfg.request_timeout)
                    .with_max_concurrent_streams(MAX_BLOB_STREAMS),
            ),
            mdns: if cfg.mdns {
                Some(
                    mdns::tokio::Behaviour::new(mdns::Config::default(), peer_id)
                        .map_err(|e| NetError::Transport(format!("mdns: {e}")))?,
                )
                .into()
            } else {
                None.into()
            },
            autonat: autonat::Behaviour::new(peer_id, crate::nat::autonat_config(&cfg.nat)),
            relay: cfg
                .relay_server
                .then(|| relay::Behaviour::new(peer_id, cfg.nat.relay.server_config()))
                .into(),
            relay_client,
            dcutr: dcutr::Behaviour::new(peer_id),
        })
    }
}

/// How long a provider record lives. Every peer re-provides a few times within it (the
/// event loop's discovery schedule), so a short one lets records of dead peers disappear
/// within minutes instead of two days.
pub const PROVIDER_RECORD_TTL: Duration = Duration::from_secs(600);

fn kademlia(peer_id: PeerId) -> kad::Behaviour<kad::store::MemoryStore> {
    let mut cfg = kad::Config::new(KAD_PROTOCOL);
    cfg.set_query_timeout(Duration::from_secs(30));
    cfg.set_provider_record_ttl(Some(PROVIDER_RECORD_TTL));
    // The swarm task bootstraps on its own schedule, once it knows a peer (kad's automatic
    // bootstrap at start only logs "no known peers").
    cfg.set_periodic_bootstrap_interval(None);
    let mut kad = kad::Behaviour::with_config(peer_id, kad::store::MemoryStore::new(peer_id), cfg);
    // Without a confirmed external address kad stays a client and answers no queries, which
    // splits small or local swarms. Every atoll peer serves the DHT.
    kad.set_mode(Some(kad::Mode::Server));
    kad
}

/// Bytes of a gossip message id.
pub const MESSAGE_ID_LEN: usize = 16;

/// A gossip message's id: its author and sequence number, as gossipsub's default id, hashed
/// to [`MESSAGE_ID_LEN`] bytes instead of spelled out in ~70 characters. Every id rides in
/// the IHAVE lists that each peer sends several peers on every gossipsub heartbeat, so at 16
/// peers the shorter ids cut a peer's gossip bytes by a quarter (bench/RESULTS.md). The
/// data stays out of the id: two authors announcing the same bytes (the same state) are
/// two votes, not one message.
pub fn message_id(m: &gossipsub::Message) -> gossipsub::MessageId {
    let mut h = blake3::Hasher::new();
    h.update(&m.source.map(|p| p.to_bytes()).unwrap_or_default());
    h.update(&m.sequence_number.unwrap_or_default().to_be_bytes());
    gossipsub::MessageId::from(&h.finalize().as_bytes()[..MESSAGE_ID_LEN])
}

fn gossip(key: &Keypair, net: &NetConfig) -> Result<gossipsub::Behaviour, NetError> {
    let cfg = gossipsub::ConfigBuilder::default()
        .max_transmit_size(GOSSIP_MAX_TRANSMIT)
        .validation_mode(gossipsub::ValidationMode::Strict)
        // We accept or reject each message ourselves before it is forwarded.
        .validate_messages()
        .heartbeat_interval(Duration::from_millis(700))
        .message_id_fn(message_id)
        // Every copy of an announcement past the first is bytes: a message reaches each
        // peer about once per mesh neighbour, so a mesh of 4 (not 6), and an author who
        // sends to its mesh only (not to every subscribed peer), cut a 16-peer swarm's
        // gossipsub bytes by half and its bytes sent by a third (bench/RESULTS.md, "Fewer
        // copies of each announcement"). Lazy gossip (IHAVE to 6 others every heartbeat)
        // still reaches the peers outside the mesh; swarms of 5 or fewer are unchanged.
        .mesh_n_low(3)
        .mesh_n(4)
        .mesh_n_high(8)
        .mesh_outbound_min(2)
        .flood_publish(false)
        .build()
        .map_err(|e| NetError::Config(format!("gossipsub: {e}")))?;
    let mut gossip =
        gossipsub::Behaviour::new(gossipsub::MessageAuthenticity::Signed(key.clone()), cfg)
            .map_err(|e| NetError::Config(format!("gossipsub: {e}")))?;
    let topic = gossipsub::IdentTopic::new(topic_name(&net.run_name)).hash();
    let on_loopback = net.listen.iter().any(|a| addr::is_loopback(a) || addr::is_unspecified(a));
    gossip
        .with_peer_score(
            scoring::params(topic, on_loopback && net.exempt_loopback),
            scoring::thresholds(),
        )
        .map_err(|e| NetError::Config(format!("gossipsub scoring: {e}")))?;
    Ok(gossip)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(source: Option<PeerId>, seqno: u64, data: &[u8]) -> gossipsub::Message {
        gossipsub::Message {
            source,
            data: data.to_vec(),
            sequence_number: Some(seqno),
            topic: gossipsub::IdentTopic::new("t").hash(),
        }
    }

    #[test]
    fn message_ids_are_short_and_name_author_and_sequence_number() {
        let (a, b) = (PeerId::random(), PeerId::random());
        let id = message_id(&message(Some(a), 7, b"state"));
        assert_eq!(id.0.len(), MESSAGE_ID_LEN);
        // The same bytes from two authors are two messages (two votes).
        assert_ne!(id, message_id(&message(Some(b), 7, b"state")));
        assert_ne!(id, message_id(&message(Some(a), 8, b"state")));
        assert_ne!(id, message_id(&message(None, 7, b"state")));
        // An author's message is one message whatever path brought it.
        assert_eq!(id, message_id(&message(Some(a), 7, b"state")));
        assert_eq!(id, message_id(&message(Some(a), 7, b"other bytes")));
    }
}
