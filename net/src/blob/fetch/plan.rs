//! Which chunk to ask of which source, and when to stop waiting: the chunk stage of a fetch
//! as a state machine. Answers and the current time go in; requests to send, the next
//! wake-up and notes (reports, slow sources, hedges) come out. No I/O, no clock.
//!
//! - Every source gets [`INFLIGHT_PER_SOURCE`] requests at a time, round robin in
//!   preference order.
//! - **Deadline.** A request unanswered after `max(DEADLINE_FLOOR, SLOW_FACTOR × expected
//!   latency)` is *late*: its source is demoted for this fetch (one request at a time, used
//!   only when no healthy source is left) and noted as slow, and the chunk is re-issued to
//!   another holder. The late request is not cancelled: if it answers first, it wins.
//! - **Hedge.** When nothing is left to hand out, an idle healthy source takes a copy of the
//!   oldest chunk still outstanding elsewhere for longer than the hedge delay. A one-chunk
//!   blob with two holders thus goes to the second after that delay if the first is silent.
//! - A chunk is issued at most [`MAX_COPIES`] times for lateness or hedging; a source that
//!   answers `Busy` waits a little longer each time before it gets new requests.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use libp2p::PeerId;

use crate::counters::RejectReason;

mod hedge;

/// Chunk requests in flight per source (pipelining hides the round trip).
pub const INFLIGHT_PER_SOURCE: usize = 4;
/// Shortest per-request deadline.
pub const DEADLINE_FLOOR: Duration = Duration::from_secs(2);
/// A request is late after this many times the expected latency (if above the floor).
pub const SLOW_FACTOR: u32 = 4;
/// Shortest hedge delay.
pub const HEDGE_FLOOR: Duration = Duration::from_millis(200);
/// Copies of one chunk issued because of lateness or hedging (answers that fail do not count).
pub const MAX_COPIES: u8 = 3;
/// `Busy` answers a source may give before it is dropped from this fetch.
pub const MAX_BUSY: u32 = 8;
/// Pause after a `Busy`, times the number of `Busy` answers so far (at most one second).
const BUSY_BACKOFF: Duration = Duration::from_millis(100);
/// Weight of a new latency sample in the moving average.
const EMA_WEIGHT: f64 = 0.3;

/// A request to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Issue {
    pub id: u64,
    pub peer: PeerId,
    pub chunk: usize,
}

/// What an answer was, as the driver classified it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A chunk that matches the chunk list.
    Verified,
    /// A chunk (or other answer) that does not: the source lied.
    Bad,
    Busy,
    NotFound,
    /// The request failed (timeout, connection closed, penalised).
    Failed,
}

/// Something the driver should act on or count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Note {
    /// Report the peer (it sent bad data).
    Report(PeerId, RejectReason),
    /// The peer missed a deadline and was demoted for this fetch.
    Slow(PeerId),
    /// A chunk was sent to a second holder.
    Hedged(PeerId),
}

/// How a source did in this fetch (for the reputation book).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SourceReport {
    pub peer: PeerId,
    /// Moving average of its answer latency, if it answered.
    pub latency: Option<Duration>,
    /// Missed a deadline or lost a hedge race.
    pub slow: bool,
}

struct Source {
    peer: PeerId,
    inflight: usize,
    busy: u32,
    resume_at: Option<Instant>,
    dropped: bool,
    demoted: bool,
    slow: bool,
    latency: Option<Duration>,
}

struct Request {
    chunk: usize,
    src: usize,
    issued: Instant,
    late: bool,
}

#[derive(Default, Clone, Copy)]
struct Chunk {
    done: bool,
    queued: bool,
    /// Requests outstanding, late or not.
    outstanding: u8,
    /// Requests outstanding and not late.
    live: u8,
    /// Requests issued so far.
    sent: u8,
}

/// The chunk stage of one fetch.
pub struct ChunkPlan {
    chunks: Vec<Chunk>,
    done: usize,
    missing: VecDeque<usize>,
    sources: Vec<Source>,
    requests: HashMap<u64, Request>,
    next_id: u64,
    /// Round-robin cursor over sources.
    cursor: usize,
    /// Latency of this fetch's answers (moving average), or the prior until one arrives.
    latency: Duration,
    observed: bool,
    notes: Vec<Note>,
}

impl ChunkPlan {
    /// A plan for `total` chunks from `holders` (in preference order); `prior` is the
    /// expected answer latency until this fetch has measured one.
    pub fn new(total: usize, holders: &[PeerId], prior: Duration) -> Self {
        let sources = holders
            .iter()
            .map(|&peer| Source {
                peer,
                inflight: 0,
                busy: 0,
                resume_at: None,
                dropped: false,
                demoted: false,
                slow: false,
                latency: None,
            })
            .collect();
        let mut chunks = vec![Chunk::default(); total];
        chunks.iter_mut().for_each(|c| c.queued = true);
        ChunkPlan {
            chunks,
            done: 0,
            missing: (0..total).collect(),
            sources,
            requests: HashMap::new(),
            next_id: 0,
            cursor: 0,
            latency: prior,
            observed: false,
            notes: Vec::new(),
        }
    }

    /// Chunks verified so far.
    pub fn done(&self) -> usize {
        self.done
    }

    pub fn is_done(&self) -> bool {
        self.done == self.chunks.len()
    }

    /// True when nothing is outstanding and no source is left: the fetch has failed.
    pub fn is_stuck(&self) -> bool {
        !self.is_done() && self.requests.is_empty() && self.sources.iter().all(|s| s.dropped)
    }

    /// The per-request deadline of this fetch.
    pub fn deadline(&self) -> Duration {
        DEADLINE_FLOOR.max(self.latency * SLOW_FACTOR)
    }

    /// How long a chunk waits before a copy goes to an idle source.
    pub fn hedge_delay(&self) -> Duration {
        (self.latency * 2).clamp(HEDGE_FLOOR, self.deadline())
    }

    /// Notes since the last call.
    pub fn take_notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }

    /// Marks late requests, then hands out chunks and hedges. Returns what to send.
    pub fn poll(&mut self, now: Instant) -> Vec<Issue> {
        self.mark_late(now);
        let mut out = Vec::new();
        self.hand_out(now, &mut out);
        if self.missing.is_empty() {
            self.hedge(now, &mut out);
        }
        out
    }

    /// When [`ChunkPlan::poll`] has something to do next (a deadline, a hedge, a source
    /// back from `Busy`), if anything.
    pub fn next_wake(&self, now: Instant) -> Option<Instant> {
        let deadline = self.deadline();
        let mut wake =
            self.requests.values().filter(|r| !r.late).map(|r| r.issued + deadline).min();
        let mut consider = |t: Instant| wake = Some(wake.map_or(t, |w| w.min(t)));
        if !self.missing.is_empty() {
            for t in self.sources.iter().filter(|s| !s.dropped).filter_map(|s| s.resume_at) {
                if t > now {
                    consider(t);
                }
            }
        } else if let Some(t) = self.next_hedge(now).map(|(t, _, _)| t) {
            consider(t.max(now + Duration::from_millis(1)));
        }
        wake
    }

    /// Takes an answer. True when `id` delivered a verified chunk first: store its bytes.
    pub fn on_answer(&mut self, id: u64, outcome: Outcome, now: Instant) -> bool {
        let Some(req) = self.requests.remove(&id) else {
            return false;
        };
        let chunk = &mut self.chunks[req.chunk];
        chunk.outstanding = chunk.outstanding.saturating_sub(1);
        if !req.late {
            chunk.live = chunk.live.saturating_sub(1);
        }
        let src = &mut self.sources[req.src];
        src.inflight = src.inflight.saturating_sub(1);
        if outcome == Outcome::Verified {
            let sample = now.saturating_duration_since(req.issued);
            src.latency = Some(ema(src.latency, sample));
            src.busy = 0;
            // It answers: slow perhaps, not stalled (the deadline has learnt its latency).
            src.demoted = false;
            self.latency = if self.observed { ema(Some(self.latency), sample) } else { sample };
            self.observed = true;
            if self.chunks[req.chunk].done {
                return false;
            }
            self.chunks[req.chunk].done = true;
            self.done += 1;
            return true;
        }
        match outcome {
            Outcome::Busy => {
                src.busy += 1;
                if src.busy > MAX_BUSY {
                    src.dropped = true;
                } else {
                    src.resume_at =
                        Some(now + (BUSY_BACKOFF * src.busy).min(Duration::from_secs(1)));
                }
            }
            Outcome::Bad => {
                if !src.dropped {
                    self.notes.push(Note::Report(src.peer, RejectReason::BadChunk));
                }
                src.dropped = true;
            }
            Outcome::NotFound | Outcome::Failed | Outcome::Verified => src.dropped = true,
        }
        let c = self.chunks[req.chunk];
        // A failed request frees its copy: re-issue even past MAX_COPIES if none is left.
        if !c.done && c.live == 0 && !c.queued && (c.sent < MAX_COPIES || c.outstanding == 0) {
            self.requeue(req.chunk);
        }
        false
    }

    /// How each source did, for the reputation book. A source still holding requests for
    /// chunks that others delivered lost a race: it counts as slow.
    pub fn reports(&self) -> Vec<SourceReport> {
        let mut lost = vec![false; self.sources.len()];
        for r in self.requests.values() {
            if self.chunks[r.chunk].done {
                lost[r.src] = true;
            }
        }
        self.sources
            .iter()
            .zip(lost)
            .map(|(s, lost)| SourceReport {
                peer: s.peer,
                latency: s.latency,
                slow: s.slow || lost,
            })
            .collect()
    }

    fn requeue(&mut self, chunk: usize) {
        self.chunks[chunk].queued = true;
        self.missing.push_front(chunk);
    }

    /// Hands out queued chunks round robin over the sources that may take one.
    fn hand_out(&mut self, now: Instant, out: &mut Vec<Issue>) {
        let mut i = 0;
        while i < self.missing.len() {
            if !(0..self.sources.len()).any(|s| self.can_take(s, now)) {
                return;
            }
            let chunk = self.missing[i];
            if self.chunks[chunk].done {
                self.chunks[chunk].queued = false;
                self.missing.remove(i);
                continue;
            }
            match self.pick_source(chunk, now) {
                Some(src) => {
                    self.missing.remove(i);
                    self.chunks[chunk].queued = false;
                    out.push(self.issue(chunk, src, now));
                }
                None => i += 1,
            }
        }
    }

    fn issue(&mut self, chunk: usize, src: usize, now: Instant) -> Issue {
        let id = self.next_id;
        self.next_id += 1;
        self.requests.insert(id, Request { chunk, src, issued: now, late: false });
        let c = &mut self.chunks[chunk];
        c.outstanding += 1;
        c.live += 1;
        c.sent = c.sent.saturating_add(1);
        self.sources[src].inflight += 1;
        Issue { id, peer: self.sources[src].peer, chunk }
    }

    /// A source for `chunk`: healthy ones round robin; demoted ones only when no healthy
    /// source is left in the fetch.
    fn pick_source(&mut self, chunk: usize, now: Instant) -> Option<usize> {
        let n = self.sources.len();
        let any_healthy = self.sources.iter().any(|s| !s.dropped && !s.demoted);
        for k in 0..n {
            let s = (self.cursor + k) % n;
            if self.sources[s].demoted && any_healthy {
                continue;
            }
            if self.can_take(s, now) && !self.has(s, chunk) {
                self.cursor = (s + 1) % n;
                return Some(s);
            }
        }
        None
    }

    fn can_take(&self, s: usize, now: Instant) -> bool {
        let src = &self.sources[s];
        let cap = if src.demoted { 1 } else { INFLIGHT_PER_SOURCE };
        !src.dropped && src.inflight < cap && src.resume_at.is_none_or(|t| t <= now)
    }

    /// True if source `s` already has a request for `chunk` outstanding.
    fn has(&self, s: usize, chunk: usize) -> bool {
        self.requests.values().any(|r| r.src == s && r.chunk == chunk)
    }
}

fn ema(old: Option<Duration>, sample: Duration) -> Duration {
    match old {
        Some(o) => o.mul_f64(1.0 - EMA_WEIGHT) + sample.mul_f64(EMA_WEIGHT),
        None => sample,
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
