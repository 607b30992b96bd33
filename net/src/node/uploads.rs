//! Queue of blob responses waiting for the upload cap.
//!
//! Inbound chunk requests are answered in FIFO order at the capped rate. The queue is
//! bounded in length and in delay: a request that would wait longer than half the request
//! timeout is answered `Busy` at once, so the requester asks another source instead of
//! timing out.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use libp2p::request_response::ResponseChannel;

use crate::blob::wire::BlobResponse;
use crate::limiter::UploadLimiter;

/// Most responses waiting for the cap.
pub const MAX_QUEUED_UPLOADS: usize = 256;

pub struct Pending {
    pub at: Instant,
    pub channel: ResponseChannel<BlobResponse>,
    pub response: BlobResponse,
}

pub struct UploadQueue {
    limiter: UploadLimiter,
    max_delay: Duration,
    queue: VecDeque<Pending>,
}

/// What to do with a response.
pub enum Admit {
    /// Send now.
    Now(ResponseChannel<BlobResponse>, BlobResponse),
    /// Queued; will be sent by [`UploadQueue::pop_ready`].
    Queued,
    /// Over the bounds: answer `Busy`.
    Busy(ResponseChannel<BlobResponse>),
}

impl UploadQueue {
    pub fn new(limiter: UploadLimiter, max_delay: Duration) -> Self {
        UploadQueue { limiter, max_delay, queue: VecDeque::new() }
    }

    /// Admits a response of `bytes` payload bytes.
    pub fn admit(
        &mut self,
        now: Instant,
        channel: ResponseChannel<BlobResponse>,
        response: BlobResponse,
    ) -> Admit {
        if !self.limiter.is_limited() {
            return Admit::Now(channel, response);
        }
        if self.queue.len() >= MAX_QUEUED_UPLOADS {
            return Admit::Busy(channel);
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
        self.queue.push_back(Pending { at, channel, response });
        Admit::Queued
    }

    /// When the next queued response may go.
    pub fn next_at(&self) -> Option<Instant> {
        self.queue.front().map(|p| p.at)
    }

    /// Takes the next response whose time has come.
    pub fn pop_ready(&mut self, now: Instant) -> Option<Pending> {
        if self.queue.front().is_some_and(|p| p.at <= now) {
            self.queue.pop_front()
        } else {
            None
        }
    }
}
