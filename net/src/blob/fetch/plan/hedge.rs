//! Lateness and hedging: a request outstanding past the deadline demotes its source and
//! puts its chunk back in the queue; a chunk outstanding longer than the hedge delay gets
//! a second copy from an idle healthy source.

use std::time::Instant;

use super::{ChunkPlan, Issue, Note, MAX_COPIES};

impl ChunkPlan {
    pub(super) fn mark_late(&mut self, now: Instant) {
        let deadline = self.deadline();
        let mut late: Vec<u64> = self
            .requests
            .iter()
            .filter(|(_, r)| !r.late && now.saturating_duration_since(r.issued) >= deadline)
            .map(|(id, _)| *id)
            .collect();
        late.sort_unstable();
        for id in late {
            let Some(r) = self.requests.get_mut(&id) else { continue };
            r.late = true;
            let (chunk, src) = (r.chunk, r.src);
            let s = &mut self.sources[src];
            s.demoted = true;
            if !s.slow {
                s.slow = true;
                self.notes.push(Note::Slow(s.peer));
            }
            let c = &mut self.chunks[chunk];
            c.live = c.live.saturating_sub(1);
            if !c.done && c.live == 0 && !c.queued && c.sent < MAX_COPIES {
                self.requeue(chunk);
            }
        }
    }

    /// Copies of chunks outstanding too long go to idle healthy sources.
    pub(super) fn hedge(&mut self, now: Instant, out: &mut Vec<Issue>) {
        while let Some((t, chunk, src)) = self.next_hedge(now) {
            if t > now {
                return;
            }
            self.notes.push(Note::Hedged(self.sources[src].peer));
            out.push(self.issue(chunk, src, now));
        }
    }

    /// The next hedge possible: when, which chunk, to which source.
    pub(super) fn next_hedge(&self, now: Instant) -> Option<(Instant, usize, usize)> {
        let delay = self.hedge_delay();
        let mut best: Option<(Instant, usize, usize)> = None;
        for r in self.requests.values() {
            let c = self.chunks[r.chunk];
            if c.done || c.live != 1 || c.sent >= 2 || c.queued {
                continue;
            }
            let t = r.issued + delay;
            if best.is_some_and(|(b, _, _)| b <= t) {
                continue;
            }
            if let Some(src) = (0..self.sources.len()).find(|&s| {
                !self.sources[s].demoted && self.can_take(s, now) && !self.has(s, r.chunk)
            }) {
                best = Some((t, r.chunk, src));
            }
        }
        best
    }
}
