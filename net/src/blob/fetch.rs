//! Fetching a blob from several peers at once, every chunk verified.
//!
//! 1. Ask sources in turn for the manifest; a manifest that does not hash to the blob marks
//!    its sender as a liar.
//! 2. Spread chunk requests over all sources that have the blob, [`INFLIGHT_PER_SOURCE`]
//!    at a time each. A chunk that fails verification drops and penalises its source; a
//!    source that errors or leaves is dropped and its chunks go back in the queue, so the
//!    transfer resumes from the others.
//!
//! No final hash of the whole blob: a manifest whose root is the blob hash plus chunks that
//! match its chaining values *is* the BLAKE3 proof that the bytes hash to the blob hash.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use libp2p::PeerId;
use tracing::{debug, warn};

use super::wire::{BlobRequest, BlobResponse};
use super::{chunk_range, BlobHash, Manifest};
use crate::client::NetClient;
use crate::counters::RejectReason;
use crate::error::{FetchError, NetError};

/// Chunk requests in flight per source (pipelining hides the round trip).
pub const INFLIGHT_PER_SOURCE: usize = 4;
/// Sources asked for the manifest at once.
const MANIFEST_PARALLEL: usize = 4;
/// Once one source has answered with the manifest, how long the others of its batch may
/// still answer to join the transfer. A stalled source (paused process, dead link) must
/// not hold the fetch until its request times out.
const MANIFEST_STRAGGLE: std::time::Duration = std::time::Duration::from_millis(250);
/// How long a batch of sources may take to answer for the manifest at all. A holder
/// answers in milliseconds; a stalled one must not hold the fetch for the whole request
/// timeout when the others said they do not have the blob.
const MANIFEST_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
/// `Busy` answers a source may give before it is dropped from this fetch.
const MAX_BUSY: u32 = 8;

struct Source {
    peer: PeerId,
    inflight: usize,
    busy: u32,
}

/// Fetches `hash` from `sources` (in preference order), refusing blobs above `max_size`
/// bytes before allocating. Returns the bytes and the manifest.
pub async fn fetch(
    client: &NetClient,
    hash: BlobHash,
    sources: Vec<PeerId>,
    max_size: u64,
) -> Result<(Bytes, Manifest), NetError> {
    let (manifest, holders) = fetch_manifest(client, hash, sources).await?;
    if manifest.size > max_size {
        return Err(FetchError::TooLarge { hash, size: manifest.size, limit: max_size }.into());
    }
    let data = fetch_chunks(client, hash, &manifest, holders).await?;
    Ok((data, manifest))
}

/// Asks sources for the manifest; returns it with the peers that answered with it.
async fn fetch_manifest(
    client: &NetClient,
    hash: BlobHash,
    sources: Vec<PeerId>,
) -> Result<(Manifest, Vec<PeerId>), NetError> {
    let mut holders = Vec::new();
    let mut found: Option<Manifest> = None;
    for batch in sources.chunks(MANIFEST_PARALLEL) {
        let mut asks: FuturesUnordered<_> = batch
            .iter()
            .map(|&peer| async move {
                let res = client.request_blob(peer, BlobRequest::Manifest { hash }).await;
                (peer, res)
            })
            .collect();
        let mut cutoff = tokio::time::Instant::now() + MANIFEST_WAIT;
        loop {
            let next = tokio::time::timeout_at(cutoff, asks.next()).await.unwrap_or(None);
            let Some((peer, res)) = next else { break };
            match res {
                Ok(BlobResponse::Manifest(m)) if m.verify(&hash) => {
                    holders.push(peer);
                    found.get_or_insert(m);
                    cutoff = cutoff.min(tokio::time::Instant::now() + MANIFEST_STRAGGLE);
                }
                Ok(BlobResponse::Manifest(_)) | Ok(BlobResponse::Chunk(_)) => {
                    warn!(peer = %peer, blob = %hash, "peer sent a manifest that does not match");
                    client.report(peer, RejectReason::BadManifest).await?;
                }
                Ok(BlobResponse::NotFound) | Ok(BlobResponse::Busy) => {}
                Err(NetError::Shutdown) => return Err(NetError::Shutdown),
                Err(e) => debug!(peer = %peer, error = %e, "manifest request failed"),
            }
        }
        // Keep asking later batches only while nobody has it: more holders are welcome but
        // not worth the wait.
        if found.is_some() {
            break;
        }
    }
    match found {
        Some(m) => Ok((m, holders)),
        None => Err(FetchError::NoManifest(hash).into()),
    }
}

async fn fetch_chunks(
    client: &NetClient,
    hash: BlobHash,
    manifest: &Manifest,
    holders: Vec<PeerId>,
) -> Result<Bytes, NetError> {
    let total = manifest.chunk_count();
    let mut buf = vec![0u8; manifest.size as usize];
    let mut missing: VecDeque<usize> = (0..total).collect();
    let mut done = 0usize;
    let mut sources: HashMap<PeerId, Source> =
        holders.iter().map(|&peer| (peer, Source { peer, inflight: 0, busy: 0 })).collect();
    let order: Vec<PeerId> = holders;
    let mut inflight = FuturesUnordered::new();
    while done < total {
        // Fill every source's pipeline, round robin over sources in preference order.
        let mut progressed = true;
        while progressed && !missing.is_empty() {
            progressed = false;
            for peer in &order {
                let Some(src) = sources.get_mut(peer) else {
                    continue;
                };
                if src.inflight >= INFLIGHT_PER_SOURCE {
                    continue;
                }
                let Some(index) = missing.pop_front() else {
                    break;
                };
                src.inflight += 1;
                progressed = true;
                let peer = src.peer;
                inflight.push(async move {
                    let req = BlobRequest::Chunk { hash, index: index as u32 };
                    (peer, index, client.request_blob(peer, req).await)
                });
            }
        }
        let Some((peer, index, res)) = inflight.next().await else {
            return Err(FetchError::SourcesExhausted { hash, done, total }.into());
        };
        if let Some(src) = sources.get_mut(&peer) {
            src.inflight -= 1;
        }
        match res {
            Ok(BlobResponse::Chunk(bytes)) if manifest.verify_chunk(index, &bytes) => {
                let r = chunk_range(manifest.size, index);
                buf[r.start as usize..r.end as usize].copy_from_slice(&bytes);
                done += 1;
            }
            Ok(BlobResponse::Busy) => {
                missing.push_back(index);
                let drop = sources.get_mut(&peer).is_some_and(|s| {
                    s.busy += 1;
                    s.busy > MAX_BUSY
                });
                if drop {
                    sources.remove(&peer);
                }
            }
            Ok(BlobResponse::Chunk(_)) | Ok(BlobResponse::Manifest(_)) => {
                missing.push_back(index);
                if sources.remove(&peer).is_some() {
                    warn!(peer = %peer, blob = %hash, chunk = index, "bad chunk: source dropped");
                    client.report(peer, RejectReason::BadChunk).await?;
                }
            }
            Ok(BlobResponse::NotFound) => {
                missing.push_back(index);
                sources.remove(&peer);
            }
            Err(NetError::Shutdown) => return Err(NetError::Shutdown),
            Err(e) => {
                debug!(peer = %peer, chunk = index, error = %e, "chunk request failed: source dropped");
                missing.push_back(index);
                sources.remove(&peer);
            }
        }
        if sources.is_empty() && inflight.is_empty() && done < total {
            return Err(FetchError::SourcesExhausted { hash, done, total }.into());
        }
    }
    Ok(Bytes::from(buf))
}
