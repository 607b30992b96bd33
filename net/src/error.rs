//! Typed errors of the peer layer, one enum per area.

use std::path::PathBuf;

use libp2p::PeerId;

use crate::blob::BlobHash;

/// Errors of starting, commanding and stopping a node.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    #[error("identity: {0}")]
    Identity(#[from] IdentityError),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot listen on {addr}: {reason}")]
    Listen { addr: String, reason: String },
    #[error("cannot dial {addr}: {reason}")]
    Dial { addr: String, reason: String },
    #[error("cannot build the libp2p transport: {0}")]
    Transport(String),
    #[error("the node has shut down")]
    Shutdown,
    #[error("announcement rejected before sending: {0}")]
    Announce(#[from] AnnounceError),
    #[error("publish failed: {0}")]
    Publish(String),
    #[error("blob request to {peer} failed: {reason}")]
    Request { peer: String, reason: String },
    #[error("peer {0} is penalised for serving bad data")]
    Penalised(String),
    #[error("too many blob requests in flight (limit {0})")]
    TooManyRequests(usize),
    #[error("blob store: {0}")]
    Store(#[from] StoreError),
    #[error("fetch: {0}")]
    Fetch(#[from] FetchError),
}

/// Errors of loading or creating the persisted peer key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    #[error("cannot read key file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write key file {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error(
        "key file {path} is corrupt ({reason}); move it away to start with a new peer id, \
         or restore the original"
    )]
    Corrupt { path: PathBuf, reason: String },
}

/// Why an announcement could not be encoded or was rejected on receipt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AnnounceError {
    #[error("message of {size} bytes exceeds the limit of {limit} bytes")]
    Oversized { size: usize, limit: usize },
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error("message of run {got:?}, expected run {expected:?}")]
    WrongRun { got: String, expected: String },
    #[error("message of protocol version {got}, expected {expected}")]
    WrongVersion { got: u16, expected: u16 },
}

/// Errors of the local blob store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("blob of {size} bytes exceeds the store budget of {budget} bytes")]
    TooLarge { size: u64, budget: u64 },
    #[error("blob of {size} bytes exceeds the maximum blob size of {max} bytes")]
    OverMaxBlobSize { size: u64, max: u64 },
}

/// Errors of fetching a blob from peers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    #[error("blob {hash} has {size} bytes, more than the {limit} bytes asked for")]
    TooLarge { hash: BlobHash, size: u64, limit: u64 },
    /// `denied`: the sources that answered that they do not hold the blob; `silent`: the
    /// ones that did not answer at all while they were asked (the others failed or were
    /// busy).
    #[error("no peer could serve the chunk list of blob {hash} ({} said they do not hold it, {} did not answer)", denied.len(), silent.len())]
    NoChunkList { hash: BlobHash, denied: Vec<PeerId>, silent: Vec<PeerId> },
    /// `denied`: the sources that answered that they do not hold the blob, or a chunk of it.
    #[error("all sources failed for blob {hash}: {done} of {total} chunks fetched")]
    SourcesExhausted { hash: BlobHash, done: usize, total: usize, denied: Vec<PeerId> },
    #[error("the node has shut down")]
    Shutdown,
}

impl FetchError {
    /// The sources that answered that they do not hold the blob (or a chunk of it): a
    /// holder that announced it and then denies it stalls its fetchers.
    pub fn denied(&self) -> &[PeerId] {
        match self {
            FetchError::NoChunkList { denied, .. }
            | FetchError::SourcesExhausted { denied, .. } => denied,
            _ => &[],
        }
    }

    /// The sources that were asked for the blob and gave no answer in the time a holder
    /// takes (a stall, a paused process, or a capped uploader's queue: not proof).
    pub fn silent(&self) -> &[PeerId] {
        match self {
            FetchError::NoChunkList { silent, .. } => silent,
            _ => &[],
        }
    }
}
