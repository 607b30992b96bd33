//! What a training peer needs from the network, as a trait: atoll-net's [`NetClient`] in a
//! real peer, [`super::memnet::MemNet`] when tests run several nodes in one process.
//!
//! The surface is small on purpose: store a payload for others, gossip an announcement,
//! fetch a payload by hash from its holders (one transfer, the implementation owning
//! sources and retries), and report a misbehaving peer. Events come back on a channel of
//! [`NetEvent`](atoll_net::NetEvent)s handed to the node next to the network.

use std::future::Future;

use atoll_net::{BlobHash, NetClient, NetError, NetStats, PeerId, RejectReason};
use bytes::Bytes;

/// A network a node publishes to and fetches from.
pub trait Network: Clone + Send + Sync + 'static {
    /// This peer's id.
    fn peer_id(&self) -> PeerId;
    /// Keeps `data` (shared, not copied) for peers to fetch, under `blake3(data)`.
    fn put_blob(&self, data: Bytes) -> Result<(), NetError>;
    /// True if a payload with this hash is kept already (stored, or fetched earlier).
    fn has_blob(&self, hash: &BlobHash) -> bool;
    /// Keeps a stored payload from eviction (`pinned`) or lets it go again; false when it
    /// cannot be kept. A network that never evicts has nothing to do.
    fn pin_blob(&self, _hash: &BlobHash, _pinned: bool) -> bool {
        true
    }
    /// Gossips an announcement to the run's peers.
    fn publish(&self, payload: Vec<u8>) -> impl Future<Output = Result<(), NetError>> + Send;
    /// Gossips this peer's heartbeat (see [`crate::heartbeat`]) to the run's peers.
    fn publish_heartbeat(
        &self,
        payload: Vec<u8>,
    ) -> impl Future<Output = Result<(), NetError>> + Send;
    /// One verified payload of at most `max_len` bytes, from `sources` first.
    fn fetch(
        &self,
        hash: BlobHash,
        sources: Vec<PeerId>,
        max_len: u64,
    ) -> impl Future<Output = Result<Bytes, NetError>> + Send;
    /// A protocol offence of `peer` (one strike; enough of them ban it).
    fn penalize(&self, peer: PeerId, reason: &'static str) -> impl Future<Output = ()> + Send;
    /// A malformed message of `peer`.
    fn report(&self, peer: PeerId, reason: RejectReason) -> impl Future<Output = ()> + Send;
    /// Counters and peers, for `status.json`.
    fn stats(&self) -> impl Future<Output = Result<NetStats, NetError>> + Send;
}

impl Network for NetClient {
    fn peer_id(&self) -> PeerId {
        NetClient::peer_id(self)
    }

    fn put_blob(&self, data: Bytes) -> Result<(), NetError> {
        NetClient::put_blob(self, data).map(|_| ())
    }

    fn has_blob(&self, hash: &BlobHash) -> bool {
        NetClient::has_blob(self, hash)
    }

    fn pin_blob(&self, hash: &BlobHash, pinned: bool) -> bool {
        NetClient::pin_blob(self, hash, pinned)
    }

    fn publish(&self, payload: Vec<u8>) -> impl Future<Output = Result<(), NetError>> + Send {
        NetClient::publish(self, payload)
    }

    fn publish_heartbeat(
        &self,
        payload: Vec<u8>,
    ) -> impl Future<Output = Result<(), NetError>> + Send {
        NetClient::publish_heartbeat(self, payload)
    }

    async fn fetch(
        &self,
        hash: BlobHash,
        sources: Vec<PeerId>,
        max_len: u64,
    ) -> Result<Bytes, NetError> {
        self.fetch_blob_limited(hash, &sources, max_len).await
    }

    async fn penalize(&self, peer: PeerId, reason: &'static str) {
        // Fails only once the network has shut down; nothing is left to penalise then.
        let _ = NetClient::penalize(self, peer, reason).await;
    }

    async fn report(&self, peer: PeerId, reason: RejectReason) {
        let _ = NetClient::report(self, peer, reason).await;
    }

    fn stats(&self) -> impl Future<Output = Result<NetStats, NetError>> + Send {
        NetClient::stats(self)
    }
}
