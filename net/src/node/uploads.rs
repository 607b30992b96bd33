//! Serving blob requests: the requester's fair share first, then the upload cap's queue.
//!
//! 1. [`FairShare`] refuses a chunk already served to this requester recently and bytes
//!    beyond its budget per window (37-byte requests must not buy megabytes in a loop).
//! 2. With a cap, responses wait in a FIFO at the capped rate. The queue is bounded in
//!    length ([`MAX_QUEUED_UPLOADS`]), per requester ([`MAX_QUEUED_PER_PEER`], so one peer
//!    cannot occupy it) and in delay: a request that would wait longer than half the
//!    request timeout is answered `Busy` at once, so the requester asks another source
//!    instead of timing out.
//!
//! Every refusal is answered `Busy`, counted by reason (`rejects.repeat_request`,
//! `rejects.over_share`) and per peer (`upload_refusals`), and logged at most once per
//! peer and reason per minute. A requester that keeps asking after refusals
//! ([`GREEDY_REPEATS`](crate::limiter::share::GREEDY_REPEATS) repeats in a window) is
//! reported once per window as [`NetEvent::UploadAbuse`], for the program to penalise.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use libp2p::request_response::ResponseChannel;
use libp2p::PeerId;
use tracing::{info, warn};

use super::event_loop::EventLoop;
use crate::blob::chunk_range;
use crate::blob::wire::{BlobRequest, BlobResponse};
use crate::client::NetEvent;
use crate::config::NetConfig;
use crate::counters::RejectReason;
use crate::limiter::share::{FairShare, Refusal};
use crate::limiter::UploadLimiter;
use crate::logthrottle::LogThrottle;

/// Most responses waiting for the cap.
pub const MAX_QUEUED_UPLOADS: usize = 256;
/// Most responses one requester may have waiting for the cap (an eighth of the queue).
pub const MAX_QUEUED_PER_PEER: usize = MAX_QUEUED_UPLOADS / 8;

pub struct Pending {
    pub at: Instant,
    pub peer: PeerId,
    pub channel: ResponseChannel<BlobResponse>,
    pub response: BlobResponse,
}

/// The uploads' state on the swarm task: fair share, cap, queue and log throttle.
pub struct UploadQueue {
    limiter: UploadLimiter,
    max_delay: Duration,
    queue: VecDeque<Pending>,
    /// Queued responses per requester; keys only for peers with some queued (≤ queue length).
    queued_per_peer: HashMap<PeerId, usize>,
    pub(super) share: FairShare,
    /// One log line per requester and refusal reason per minute.
    log: LogThrottle<PeerId>,
    /// The cap in bytes per second, as configured (for the status file).
    cap: Option<u64>,
}

/// What to do with a response.
pub enum Admit {
    /// Send now.
    Now(ResponseChannel<BlobResponse>, BlobResponse),
    /// Queued; will be sent by [`UploadQueue::pop_ready`].
    Queued,
    /// Over the queue's bounds (everyone's load): answer `Busy`.
    Busy(ResponseChannel<BlobResponse>),
    /// Over this requester's share of the queue: answer `Busy` and count it against it.
    PeerBusy(ResponseChannel<BlobResponse>),
}

impl UploadQueue {
    pub fn new(cfg: &NetConfig, now: Instant) -> Self {
        UploadQueue {
            limiter: UploadLimiter::new(cfg.max_upload_bytes_per_sec, now),
            max_delay: cfg.request_timeout / 2,
            queue: VecDeque::new(),
            queued_per_peer: HashMap::new(),
            share: FairShare::new(cfg.upload_share),
            log: LogThrottle::default(),
            cap: cfg.max_upload_bytes_per_sec.filter(|r| *r > 0),
        }
    }

    /// The upload cap in bytes per second (`None`: none).
    pub fn cap(&self) -> Option<u64> {
        self.cap
    }

    /// Admits a response for `peer` (its payload is what the cap measures).
    pub fn admit(
        &mut self,
        now: Instant,
        peer: PeerId,
        channel: ResponseChannel<BlobResponse>,
        response: BlobResponse,
    ) -> Admit {
        if !self.limiter.is_limited() {
            return Admit::Now(channel, response);
        }
        if self.queue.len() >= MAX_QUEUED_UPLOADS {
            return Admit::Busy(channel);
        }
        if self.queued_per_peer.get(&peer).copied().unwrap_or(0) >= MAX_QUEUED_PER_PEER {
            return Admit::PeerBusy(channel);
        }
        let bytes = response.payload_len() as u64;
        let at = self.limiter.reserve(now, bytes);
        if at > now + self.max_delay {
            self.limiter.refund(bytes);
            return Admit::Busy(channel);
        }
        if at <= now && self.queue.is_empty() {
            return Admit::Now(channel, response);
        }
        *self.queued_per_peer.entry(peer).or_default() += 1;
        self.queue.push_back(Pending { at, peer, channel, response });
        Admit::Queued
    }

    /// When the next queued response may go.
    pub fn next_at(&self) -> Option<Instant> {
        self.queue.front().map(|p| p.at)
    }

    /// Takes the next response whose time has come.
    pub fn pop_ready(&mut self, now: Instant) -> Option<Pending> {
        if self.queue.front().is_none_or(|p| p.at > now) {
            return None;
        }
        let p = self.queue.pop_front()?;
        if let Some(n) = self.queued_per_peer.get_mut(&p.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.queued_per_peer.remove(&p.peer);
            }
        }
        Some(p)
    }

    /// Log lines about refused requesters left out by the throttle.
    pub fn log_suppressed(&self) -> u64 {
        self.log.suppressed()
    }
}

impl EventLoop {
    /// Answers one inbound blob request: look up, fair share, then the cap's queue.
    pub(super) fn serve(
        &mut self,
        peer: PeerId,
        request: BlobRequest,
        channel: ResponseChannel<BlobResponse>,
    ) {
        let now = Instant::now();
        let (response, key, largest) = {
            let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
            let largest = store.largest_bytes();
            match request {
                BlobRequest::ChunkList { hash } => match store.get(&hash) {
                    Some((_, m)) => (BlobResponse::ChunkList((*m).clone()), None, largest),
                    None => (BlobResponse::NotFound, None, largest),
                },
                BlobRequest::Chunk { hash, index } => match store.get(&hash) {
                    Some((data, m)) if (index as usize) < m.chunk_count() => {
                        let r = chunk_range(m.size, index as usize);
                        let chunk = data.slice(r.start as usize..r.end as usize);
                        (BlobResponse::Chunk(chunk), Some((hash, index)), largest)
                    }
                    _ => (BlobResponse::NotFound, None, largest),
                },
            }
        };
        let len = response.payload_len() as u64;
        let grant = if matches!(response, BlobResponse::NotFound) {
            None
        } else {
            match self.uploads.share.admit(peer, key, len, largest, now) {
                Ok(g) => Some(g),
                Err(refusal) => {
                    self.upload_refused(peer, refusal, now);
                    let _ =
                        self.swarm.behaviour_mut().blob.send_response(channel, BlobResponse::Busy);
                    return;
                }
            }
        };
        let (channel, response) = match self.uploads.admit(now, peer, channel, response) {
            Admit::Now(c, r) => {
                self.peers.add_bytes(peer, len, 0);
                (c, r)
            }
            Admit::Queued => return self.peers.add_bytes(peer, len, 0),
            Admit::Busy(c) => {
                if let Some(g) = grant {
                    self.uploads.share.refund(g);
                }
                (c, BlobResponse::Busy)
            }
            Admit::PeerBusy(c) => {
                if let Some(g) = grant {
                    self.uploads.share.refund(g);
                }
                let refusal = self.uploads.share.refuse(peer, RejectReason::OverShare, now);
                self.upload_refused(peer, refusal, now);
                (c, BlobResponse::Busy)
            }
        };
        let _ = self.swarm.behaviour_mut().blob.send_response(channel, response);
    }

    /// Counts a refusal, logs it (throttled) and reports a requester that keeps asking.
    fn upload_refused(&mut self, peer: PeerId, refusal: Refusal, now: Instant) {
        *self.peers.rejects.entry(refusal.reason).or_default() += 1;
        let reason = refusal.reason.as_str();
        if let Some(suppressed) = self.uploads.log.check(peer, reason, now) {
            info!(
                peer = %peer,
                reason,
                suppressed,
                "blob request refused (one line per peer and reason per minute; see rejects)"
            );
        }
        if refusal.greedy {
            if self.uploads.log.allow(peer, "upload_abuse", now) {
                warn!(
                    peer = %peer,
                    refused = refusal.refused_in_window,
                    "peer keeps requesting blob data after refusals"
                );
            }
            self.emit(NetEvent::UploadAbuse {
                peer,
                refused: u64::from(refusal.refused_in_window),
            });
        }
    }
}
