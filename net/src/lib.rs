//! atoll-net: the libp2p peer layer. It moves bytes and blake3 hashes between the peers of
//! a run and knows nothing of models.
//!
//! Map of the crate:
//! - [`node`]: starts a node (one task owns the Swarm) and stops it, awaited.
//! - [`client`]: [`NetClient`], the cloneable handle (publish, blobs, stats) and
//!   [`NetEvent`], the one event stream.
//! - [`config`]: [`NetConfig`], run names and the run's DHT key.
//! - [`identity`]: the ed25519 key persisted in the run dir.
//! - [`behaviour`]: the composed protocols (Kademlia `/atoll/kad/1.0.0`, identify, ping,
//!   gossipsub with peer scoring, blob request-response, mDNS) and their settings.
//! - `addr`: what an address says (loopback, unspecified), for the behaviour and the node.
//! - [`transport`]: TCP+noise+yamux or QUIC, every substream byte counted.
//! - [`streamkind`]: a substream's protocol family, read from its multistream-select
//!   opening, so the transport counts bytes per protocol.
//! - [`advert`]: the run's manifest hash in identify's agent version, and reading it back.
//! - [`announce`]: the versioned envelope of announcements and its checks.
//! - [`heartbeat`]: the run's heartbeat topic (opaque bytes, bounded, rate-limited per author).
//! - [`blob`]: content addressing, verified chunk lists, the store, the wire protocol
//!   and multi-source fetching.
//! - [`fault`]: fault injection for tests (a block list re-read from a file).
//! - [`bans`]: strikes against misbehaving peers, bans and the ban file.
//! - [`iplimit`]: caps on inbound connections per remote IP.
//! - [`swarmkey`]: private swarms (pre-shared key, libp2p pnet) and the `swarm.key` format.
//! - [`nat`]: NAT traversal settings (AutoNAT, circuit relay v2, hole punching).
//! - [`limiter`]: the upload cap (token bucket).
//! - [`logthrottle`]: at most one log line per (peer, reason) per window.
//! - [`counters`]: byte counters, reject reasons and the [`NetStats`] snapshot.
//! - [`error`]: typed errors.
//!
//! Typical use:
//! ```no_run
//! # async fn demo() -> Result<(), atoll_net::NetError> {
//! use atoll_net::{identity, NetConfig, Node};
//! let key = identity::load_or_create(std::path::Path::new("run/peer_key"))?;
//! let mut cfg = NetConfig::new(key, "my-run");
//! cfg.listen.push("/ip4/127.0.0.1/tcp/0".parse().unwrap());
//! let mut node = Node::start(cfg).await?;
//! node.client.publish(b"hello".to_vec()).await.ok(); // fails while no peer listens
//! let hash = node.client.put_blob(bytes::Bytes::from_static(b"delta"))?;
//! while let Some(event) = node.events.recv().await { let _ = (event, hash); break; }
//! node.handle.shutdown().await?;
//! # Ok(()) }
//! ```

pub(crate) mod addr;
pub mod advert;
pub mod announce;
pub mod bans;
pub mod behaviour;
pub mod blob;
pub mod client;
pub mod config;
pub mod counters;
pub mod error;
pub mod fault;
pub mod heartbeat;
pub mod identity;
pub mod iplimit;
pub mod limiter;
pub mod logthrottle;
pub mod nat;
pub mod node;
pub mod streamkind;
pub mod swarmkey;
pub mod transport;

pub use blob::{BlobHash, ChunkList, CHUNK_SIZE};
pub use client::{NetClient, NetEvent};
pub use config::{NetConfig, DEFAULT_RUN_NAME};
pub use counters::{
    BannedPeer, ByteCount, DialFailure, LinkKind, NetStats, PeerLink, Reachability, RejectReason,
    RelayStats, StruckPeer,
};
pub use error::{AnnounceError, FetchError, IdentityError, NetError, StoreError};
pub use libp2p::identity::Keypair;
pub use libp2p::{multiaddr, Multiaddr, PeerId};
pub use node::{Node, NodeHandle};
pub use swarmkey::SwarmKeyError;
