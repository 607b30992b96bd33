//! The cloneable handle the rest of the program uses to talk to the swarm task.
//!
//! Commands go over one bounded channel, each with a oneshot for its answer; the swarm
//! task never blocks on a client. Blobs are put into and read from the shared store
//! directly (a short std mutex, no I/O under it); fetches run in the caller's task.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use libp2p::{Multiaddr, PeerId};
use tokio::sync::{mpsc, oneshot};

use crate::blob::fetch::sources::SourceBook;
use crate::blob::fetch::{self, BlobPeers};
use crate::blob::store::BlobStore;
use crate::blob::wire::{BlobRequest, BlobResponse};
use crate::blob::{BlobHash, ChunkList, MAX_BLOB_SIZE};
use crate::counters::{NetStats, RejectReason};
use crate::error::NetError;

/// Capacity of the command channel (clients wait when it is full).
pub const COMMAND_CAPACITY: usize = 256;
/// Capacity of the event stream; when full, new events are dropped and counted.
pub const EVENT_CAPACITY: usize = 1024;

/// What the node tells the program.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NetEvent {
    /// A valid announcement of our run. `from` forwarded it; `author` signed it.
    Announcement { from: PeerId, author: Option<PeerId>, payload: Bytes },
    /// A peer of our run is connected (first time or again).
    RunPeerJoined(PeerId),
    /// A peer of our run is no longer connected.
    RunPeerLeft(PeerId),
    /// A peer served bad data and is ignored for a while.
    PeerPenalised { peer: PeerId, reason: RejectReason },
    /// A peer reached [`crate::bans::BAN_STRIKES`] and is banned for the run: refused,
    /// disconnected and written to the ban file. `reason` names its last strike.
    PeerBanned { peer: PeerId, reason: &'static str },
    /// A peer kept asking for blob data after being refused (chunks it was just served,
    /// or beyond its fair share of our uploads): `refused` requests in the current window.
    /// Sent once per peer per window; the program may penalise it.
    UploadAbuse { peer: PeerId, refused: u64 },
    /// A heartbeat of a run peer (opaque bytes, at most
    /// [`crate::heartbeat::MAX_HEARTBEAT_BYTES`]), signed by `author` and within its rate.
    /// What it says is the author's claim.
    Heartbeat { author: PeerId, payload: Bytes },
    /// A connected peer of our wire version told us (identify) which run manifest it
    /// serves (`None`: it did not say). Sent on each identify, i.e. once per connection.
    PeerIdentified { peer: PeerId, manifest: Option<crate::BlobHash> },
}

pub(crate) enum Command {
    Publish {
        payload: Vec<u8>,
        reply: oneshot::Sender<Result<(), NetError>>,
    },
    BlobRequest {
        peer: PeerId,
        request: BlobRequest,
        reply: oneshot::Sender<Result<BlobResponse, NetError>>,
    },
    Dial {
        addr: Multiaddr,
        reply: oneshot::Sender<Result<(), NetError>>,
    },
    Report {
        peer: PeerId,
        reason: RejectReason,
    },
    Stats {
        reply: oneshot::Sender<NetStats>,
    },
    RunPeers {
        reply: oneshot::Sender<Vec<PeerId>>,
    },
    Penalize {
        peer: PeerId,
        reason: &'static str,
    },
    Banned {
        reply: oneshot::Sender<Vec<PeerId>>,
    },
    Heartbeat {
        payload: Vec<u8>,
        reply: oneshot::Sender<Result<(), NetError>>,
    },
}

/// Cloneable handle to a running node.
#[derive(Clone)]
pub struct NetClient {
    pub(crate) peer_id: PeerId,
    pub(crate) commands: mpsc::Sender<Command>,
    pub(crate) store: Arc<Mutex<BlobStore>>,
    /// Source reputations and fetch counters, shared by all clones (fetches run in the
    /// callers' tasks).
    pub(crate) sources: Arc<Mutex<SourceBook>>,
}

impl std::fmt::Debug for NetClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetClient").field("peer_id", &self.peer_id).finish()
    }
}

impl NetClient {
    /// This node's peer id.
    pub fn peer_id(&self) -> PeerId {
        self.peer_id
    }

    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, NetError> {
        let (tx, rx) = oneshot::channel();
        self.commands.send(make(tx)).await.map_err(|_| NetError::Shutdown)?;
        rx.await.map_err(|_| NetError::Shutdown)
    }

    /// Publishes an announcement payload to the run's topic (at most
    /// [`crate::announce::MAX_ANNOUNCE_BYTES`] with the envelope).
    pub async fn publish(&self, payload: Vec<u8>) -> Result<(), NetError> {
        self.ask(|reply| Command::Publish { payload, reply }).await?
    }

    /// Publishes a heartbeat (at most [`crate::heartbeat::MAX_HEARTBEAT_BYTES`]) on the
    /// run's heartbeat topic. Peers drop an author's heartbeats beyond
    /// [`crate::heartbeat::HEARTBEAT_RATE`]: send one every few seconds, never more often
    /// than [`crate::heartbeat::MIN_HEARTBEAT_GAP`]. Fails while no peer listens.
    pub async fn publish_heartbeat(&self, payload: Vec<u8>) -> Result<(), NetError> {
        self.ask(|reply| Command::Heartbeat { payload, reply }).await?
    }

    /// Dials an address (e.g. a bootstrap peer learnt later).
    pub async fn dial(&self, addr: Multiaddr) -> Result<(), NetError> {
        self.ask(|reply| Command::Dial { addr, reply }).await?
    }

    /// A snapshot of counters and peers.
    pub async fn stats(&self) -> Result<NetStats, NetError> {
        let mut stats = self.ask(|reply| Command::Stats { reply }).await?;
        let book = self.lock_sources();
        stats.hedged_requests = book.hedged;
        stats.slow_sources = book.slow;
        stats.log_suppressed += book.log_suppressed();
        Ok(stats)
    }

    /// Connected peers of our run.
    pub async fn run_peers(&self) -> Result<Vec<PeerId>, NetError> {
        self.ask(|reply| Command::RunPeers { reply }).await
    }

    /// One raw blob request to one peer (the building block of [`NetClient::fetch_blob`]).
    pub async fn request_blob(
        &self,
        peer: PeerId,
        request: BlobRequest,
    ) -> Result<BlobResponse, NetError> {
        self.ask(|reply| Command::BlobRequest { peer, request, reply }).await?
    }

    /// Reports a peer that misbehaved; penalising reasons make the node refuse to ask it
    /// for data for a while.
    pub async fn report(&self, peer: PeerId, reason: RejectReason) -> Result<(), NetError> {
        self.commands.send(Command::Report { peer, reason }).await.map_err(|_| NetError::Shutdown)
    }

    /// Stores a blob locally (hashing it once, on the caller's thread) so peers can fetch
    /// it. Returns its hash, `blake3(data)`.
    pub fn put_blob(&self, data: Bytes) -> Result<BlobHash, NetError> {
        let chunk_list = ChunkList::compute(&data);
        let hash = chunk_list.root().unwrap_or_else(|| BlobHash::of(&data));
        self.lock_store().insert(hash, data, Arc::new(chunk_list))?;
        Ok(hash)
    }

    /// A locally stored blob.
    pub fn get_blob(&self, hash: &BlobHash) -> Option<Bytes> {
        self.lock_store().get(hash).map(|(data, _)| data)
    }

    /// True if the blob is stored locally.
    pub fn has_blob(&self, hash: &BlobHash) -> bool {
        self.lock_store().contains(hash)
    }

    /// Keeps a stored blob from eviction (`pinned`) or lets it go again; false when it
    /// cannot be pinned (see [`crate::blob::BlobStore::pin`]).
    pub fn pin_blob(&self, hash: &BlobHash, pinned: bool) -> bool {
        let mut store = self.lock_store();
        if pinned {
            store.pin(hash)
        } else {
            store.unpin(hash);
            true
        }
    }

    /// Fetches a blob: from the local store if there, else from `sources` (tried first) and
    /// the connected run peers, several at once, each chunk verified. The blob is stored
    /// locally afterwards, so this node serves it too.
    pub async fn fetch_blob(&self, hash: BlobHash, sources: &[PeerId]) -> Result<Bytes, NetError> {
        self.fetch_blob_limited(hash, sources, MAX_BLOB_SIZE).await
    }

    /// Like [`NetClient::fetch_blob`], but refuses a blob larger than `max_size` bytes
    /// (checked on the verified chunk list, before the blob's memory is allocated). Use it
    /// when an announcement told the expected size.
    pub async fn fetch_blob_limited(
        &self,
        hash: BlobHash,
        sources: &[PeerId],
        max_size: u64,
    ) -> Result<Bytes, NetError> {
        if let Some(data) = self.get_blob(&hash) {
            return Ok(data);
        }
        let mut all: Vec<PeerId> = Vec::new();
        for p in sources.iter().copied().chain(self.run_peers().await?) {
            if p != self.peer_id && !all.contains(&p) {
                all.push(p);
            }
        }
        let (data, chunk_list) = fetch::fetch(self, hash, all, max_size).await?;
        self.lock_store().insert(hash, data.clone(), Arc::new(chunk_list))?;
        Ok(data)
    }

    /// Test hook: stores `data` under `hash` with `chunk list` *without* checking that they
    /// match; this is how tests build a peer that serves wrong bytes. Never use it elsewhere.
    #[doc(hidden)]
    pub fn insert_unverified_for_tests(
        &self,
        hash: BlobHash,
        data: Bytes,
        chunk_list: ChunkList,
    ) -> Result<(), NetError> {
        self.lock_store().insert(hash, data, Arc::new(chunk_list))?;
        Ok(())
    }

    pub(crate) fn lock_sources(&self) -> std::sync::MutexGuard<'_, SourceBook> {
        // As for the store: nothing under this lock can be left half-done by a panic.
        self.sources.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn lock_store(&self) -> std::sync::MutexGuard<'_, BlobStore> {
        // A panic while holding this lock cannot leave the store inconsistent in a way that
        // matters more than losing the node, so a poisoned lock is taken over.
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reports that `peer` misbehaved (the protocol core found a bad delta, a forged claim,
    /// an equivocation, ...): one strike, counted under `reason` in
    /// [`NetStats::strikes`], lowers its gossipsub score; [`crate::bans::BAN_STRIKES`]
    /// standing strikes ban it for the run. Strikes fade by one per
    /// [`crate::bans::STRIKE_DECAY`].
    pub async fn penalize(&self, peer: PeerId, reason: &'static str) -> Result<(), NetError> {
        self.commands.send(Command::Penalize { peer, reason }).await.map_err(|_| NetError::Shutdown)
    }

    /// Peers banned for the run, sorted.
    pub async fn banned(&self) -> Result<Vec<PeerId>, NetError> {
        self.ask(|reply| Command::Banned { reply }).await
    }
}

/// A fetch asks and reports peers through the swarm task and shares the client's book.
impl BlobPeers for NetClient {
    async fn request(&self, peer: PeerId, request: BlobRequest) -> Result<BlobResponse, NetError> {
        self.request_blob(peer, request).await
    }

    async fn report(&self, peer: PeerId, reason: RejectReason) -> Result<(), NetError> {
        NetClient::report(self, peer, reason).await
    }

    fn book(&self) -> std::sync::MutexGuard<'_, SourceBook> {
        self.lock_sources()
    }
}
