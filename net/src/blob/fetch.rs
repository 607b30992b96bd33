//! Fetching a blob from several peers at once, every chunk verified.
//!
//! 1. Order the sources by reputation ([`sources::SourceBook`]: those slow before go
//!    last), then ask them in turn for the chunk list; a chunk list that does not hash to the
//!    blob marks its sender as a liar. Holders keep that order.
//! 2. Spread chunk requests over the holders ([`plan::ChunkPlan`]): a chunk that fails
//!    verification drops and penalises its source; a source that errors or leaves is
//!    dropped and its chunks go back in the queue, so the transfer resumes from the others.
//!    A request unanswered past its deadline demotes its source for this fetch and goes to
//!    another holder; an idle holder takes a copy (hedge) of a chunk outstanding too long.
//!    The first verified answer wins.
//!
//! No final hash of the whole blob: a chunk list whose root is the blob hash plus chunks that
//! match its chaining values *is* the BLAKE3 proof that the bytes hash to the blob hash.

pub mod plan;
pub mod sources;

use std::sync::MutexGuard;
use std::time::Instant;

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use libp2p::PeerId;
use tracing::{debug, info, warn};

use self::plan::{ChunkPlan, Note, Outcome};
use self::sources::SourceBook;
use super::wire::{BlobRequest, BlobResponse};
use super::{chunk_range, BlobHash, ChunkList};
use crate::counters::RejectReason;
use crate::error::{FetchError, NetError};

pub use self::plan::INFLIGHT_PER_SOURCE;

/// Sources asked for the chunk list at once.
const MANIFEST_PARALLEL: usize = 4;
/// Once one source has answered with the chunk list, how long the others of its batch may
/// still answer to join the transfer. A stalled source (paused process, dead link) must
/// not hold the fetch until its request times out.
const MANIFEST_STRAGGLE: std::time::Duration = std::time::Duration::from_millis(250);
/// How long a batch of sources may take to answer for the chunk list at all. A holder
/// answers in milliseconds; a stalled one must not hold the fetch for the whole request
/// timeout when the others said they do not have the blob.
const MANIFEST_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// What a fetch needs of the node: one request to one peer, a report against one, and the
/// book of source reputations that all fetches share. The node's client is one; the fetch
/// knows nothing else of it.
pub(crate) trait BlobPeers {
    /// One raw blob request to one peer.
    async fn request(&self, peer: PeerId, request: BlobRequest) -> Result<BlobResponse, NetError>;
    /// Reports a peer that sent bad data.
    async fn report(&self, peer: PeerId, reason: RejectReason) -> Result<(), NetError>;
    /// The reputations and fetch counters, shared by all fetches (a short lock, no I/O).
    fn book(&self) -> MutexGuard<'_, SourceBook>;
}

/// Fetches `hash` from `sources` (in preference order), refusing blobs above `max_size`
/// bytes before allocating. Returns the bytes and the chunk list.
pub(crate) async fn fetch(
    peers: &impl BlobPeers,
    hash: BlobHash,
    mut sources: Vec<PeerId>,
    max_size: u64,
) -> Result<(Bytes, ChunkList), NetError> {
    peers.book().order(&mut sources);
    let mut denied = Vec::new();
    let (chunk_list, holders) = fetch_chunk_list(peers, hash, sources, &mut denied).await?;
    if chunk_list.size > max_size {
        return Err(FetchError::TooLarge { hash, size: chunk_list.size, limit: max_size }.into());
    }
    let data = fetch_chunks(peers, hash, &chunk_list, holders, denied).await?;
    Ok((data, chunk_list))
}

/// Asks sources for the chunk list; returns it with the peers that answered with it, in the
/// order of `sources`. The sources that answered that they do not hold it go to `denied`;
/// if nobody had it, the error also names the sources still silent when their batch's
/// [`MANIFEST_WAIT`] ran out.
async fn fetch_chunk_list(
    peers: &impl BlobPeers,
    hash: BlobHash,
    sources: Vec<PeerId>,
    denied: &mut Vec<PeerId>,
) -> Result<(ChunkList, Vec<PeerId>), NetError> {
    let mut holders: Vec<(usize, PeerId)> = Vec::new();
    let mut found: Option<ChunkList> = None;
    let mut silent: Vec<PeerId> = Vec::new();
    for (b, batch) in sources.chunks(MANIFEST_PARALLEL).enumerate() {
        let mut answered: Vec<PeerId> = Vec::with_capacity(batch.len());
        let mut asks: FuturesUnordered<_> = batch
            .iter()
            .enumerate()
            .map(|(i, &peer)| async move {
                let res = peers.request(peer, BlobRequest::ChunkList { hash }).await;
                (b * MANIFEST_PARALLEL + i, peer, res)
            })
            .collect();
        let mut cutoff = tokio::time::Instant::now() + MANIFEST_WAIT;
        loop {
            let next = tokio::time::timeout_at(cutoff, asks.next()).await.unwrap_or(None);
            let Some((rank, peer, res)) = next else { break };
            answered.push(peer);
            match res {
                Ok(BlobResponse::ChunkList(m)) if m.verify(&hash) => {
                    holders.push((rank, peer));
                    found.get_or_insert(m);
                    cutoff = cutoff.min(tokio::time::Instant::now() + MANIFEST_STRAGGLE);
                }
                Ok(BlobResponse::ChunkList(_)) | Ok(BlobResponse::Chunk(_)) => {
                    log_bad(peers, peer, hash, RejectReason::BadChunkList);
                    peers.report(peer, RejectReason::BadChunkList).await?;
                }
                Ok(BlobResponse::NotFound) => denied.push(peer),
                Ok(BlobResponse::Busy) => {}
                Err(NetError::Shutdown) => return Err(NetError::Shutdown),
                Err(e) => debug!(peer = %peer, error = %e, "chunk list request failed"),
            }
        }
        // Keep asking later batches only while nobody has it: more holders are welcome but
        // not worth the wait.
        if found.is_some() {
            break;
        }
        silent.extend(batch.iter().filter(|p| !answered.contains(p)));
    }
    holders.sort_unstable_by_key(|(rank, _)| *rank);
    match found {
        Some(m) => Ok((m, holders.into_iter().map(|(_, p)| p).collect())),
        None => {
            Err(FetchError::NoChunkList { hash, denied: std::mem::take(denied), silent }.into())
        }
    }
}

async fn fetch_chunks(
    peers: &impl BlobPeers,
    hash: BlobHash,
    chunk_list: &ChunkList,
    holders: Vec<PeerId>,
    mut denied: Vec<PeerId>,
) -> Result<Bytes, NetError> {
    let total = chunk_list.chunk_count();
    let mut buf = vec![0u8; chunk_list.size as usize];
    let prior = peers.book().prior();
    let mut plan = ChunkPlan::new(total, &holders, prior);
    let mut inflight = FuturesUnordered::new();
    let result = loop {
        let now = Instant::now();
        for issue in plan.poll(now) {
            inflight.push(async move {
                let req = BlobRequest::Chunk { hash, index: issue.chunk as u32 };
                (issue, peers.request(issue.peer, req).await)
            });
        }
        if let Err(e) = apply_notes(peers, hash, &mut plan).await {
            break Err(e);
        }
        if plan.is_done() {
            break Ok(());
        }
        if plan.is_stuck() {
            break Err(exhausted(hash, plan.done(), total, denied).into());
        }
        let wake = plan.next_wake(now).map(tokio::time::Instant::from_std);
        if inflight.is_empty() && wake.is_none() {
            // Cannot happen while the plan is consistent; never wait forever on nothing.
            break Err(exhausted(hash, plan.done(), total, denied).into());
        }
        tokio::select! {
            Some((issue, res)) = inflight.next(), if !inflight.is_empty() => {
                let outcome = match res {
                    Ok(BlobResponse::Chunk(bytes)) if chunk_list.verify_chunk(issue.chunk, &bytes) => {
                        let at = Instant::now();
                        if plan.on_answer(issue.id, Outcome::Verified, at) {
                            let r = chunk_range(chunk_list.size, issue.chunk);
                            buf[r.start as usize..r.end as usize].copy_from_slice(&bytes);
                        }
                        continue;
                    }
                    Ok(BlobResponse::Chunk(_)) | Ok(BlobResponse::ChunkList(_)) => Outcome::Bad,
                    Ok(BlobResponse::Busy) => Outcome::Busy,
                    Ok(BlobResponse::NotFound) => {
                        if !denied.contains(&issue.peer) {
                            denied.push(issue.peer);
                        }
                        Outcome::NotFound
                    }
                    Err(NetError::Shutdown) => break Err(NetError::Shutdown),
                    Err(e) => {
                        debug!(peer = %issue.peer, chunk = issue.chunk, error = %e, "chunk request failed: source dropped");
                        Outcome::Failed
                    }
                };
                plan.on_answer(issue.id, outcome, Instant::now());
            }
            _ = sleep_until_opt(wake) => {}
        }
    };
    peers.book().learn(&plan.reports());
    result.map(|()| Bytes::from(buf))
}

/// The error of a fetch that ran out of sources with chunks missing.
fn exhausted(hash: BlobHash, done: usize, total: usize, denied: Vec<PeerId>) -> FetchError {
    FetchError::SourcesExhausted { hash, done, total, denied }
}

/// Sleeps until `at`, or forever when there is nothing to wake for.
async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Counts, logs (throttled) and reports what the plan noted.
async fn apply_notes(
    peers: &impl BlobPeers,
    hash: BlobHash,
    plan: &mut ChunkPlan,
) -> Result<(), NetError> {
    for note in plan.take_notes() {
        match note {
            Note::Report(peer, reason) => {
                log_bad(peers, peer, hash, reason);
                peers.report(peer, reason).await?;
            }
            Note::Slow(peer) => {
                let deadline = plan.deadline();
                let log = {
                    let mut book = peers.book();
                    book.slow += 1;
                    book.log_check(peer, "slow_source", Instant::now())
                };
                if let Some(suppressed) = log {
                    info!(
                        peer = %peer,
                        blob = %hash,
                        deadline_ms = deadline.as_millis() as u64,
                        suppressed,
                        "source missed its deadline: demoted for this fetch, chunks re-issued"
                    );
                }
            }
            Note::Hedged(_) => {
                peers.book().hedged += 1;
            }
        }
    }
    Ok(())
}

/// Logs a source that sent bad data (one line per peer and reason per minute).
fn log_bad(peers: &impl BlobPeers, peer: PeerId, hash: BlobHash, reason: RejectReason) {
    let allowed = peers.book().log_check(peer, reason.as_str(), Instant::now());
    if let Some(suppressed) = allowed {
        warn!(peer = %peer, blob = %hash, reason = reason.as_str(), suppressed, "source sent bad data: dropped");
    }
}
