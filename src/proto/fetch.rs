//! Fetches of announced payloads: one table of what is in flight, one [`Output::Fetch`]
//! per hash (the executor owns sources, hedging and retries), one sweep timer for all
//! deadlines, and verification on arrival.

use super::core::{misbehaved, Protocol};
use super::io::{Offence, Output, Timer};
use super::schedule::Millis;
use super::PeerId;
use crate::delta::ContentHash;
use bytes::Bytes;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Kind {
    /// A delta, with what each announcer (always its claimed author) said it holds.
    Delta { claims: Vec<Claim> },
    /// A state, voted for round `round`: the payload must be of that round.
    State { round: u64 },
    /// A delta a fetched state's log lists, for checking that state (src/proto/check.rs).
    Listed,
}

/// What a signed announcement says about a delta; checked against the delta's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Claim {
    pub author: PeerId,
    pub round: u64,
    pub tokens: u64,
    pub steps: u64,
}

#[derive(Debug, Clone)]
pub(super) struct InFlight {
    pub(super) fragment: usize,
    pub(super) kind: Kind,
    pub(super) announced_at: Millis,
    /// When the fetch is given up (and cancelled).
    pub(super) deadline: Millis,
    pub(super) max_len: u64,
    /// How many of a delta's claims (in announcement order) this fetch, and the ones it
    /// replaced, asked: the first announcer at first, every claim listed at a retry.
    pub(super) asked: usize,
}

/// Most silent holders of one failed fetch counted (the executor asks at most 8 named
/// holders and some connected peers beside them).
const MAX_NAMED_SILENT: usize = 8;

/// Most rejected hashes remembered (so a bad payload is not fetched again and again).
const MAX_REJECTED: usize = 4096;

impl Protocol {
    /// Starts fetching `hash` (announced with `max_len` bytes) from `holders`: one
    /// [`Output::Fetch`] with the deadline; a delta's announced size counts against the
    /// held-bytes budget until [`Self::end_fetch`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_fetch(
        &mut self,
        hash: ContentHash,
        fragment: usize,
        kind: Kind,
        holders: Vec<PeerId>,
        max_len: u64,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        if matches!(kind, Kind::Delta { .. } | Kind::Listed) {
            self.in_flight_bytes += max_len;
        }
        let r = self.settings.raw();
        let deadline =
            now.saturating_add(r.fetch_timeout_ms.saturating_mul(u64::from(r.fetch_attempts)));
        let asked = match &kind {
            Kind::Delta { claims } => claims.len(),
            Kind::State { .. } | Kind::Listed => 0,
        };
        self.in_flight
            .insert(hash, InFlight { fragment, kind, announced_at: now, deadline, max_len, asked });
        self.metrics.fetches += 1;
        out.push(Output::Fetch { hash, holders, max_len, deadline });
        if self.sweep_at.is_none() {
            self.arm_sweep(now, out);
        }
    }

    /// The fetch of `hash` failed or ran out of time: forget it, and do not chase it again
    /// for two periods, a delta as a state. Every holder was tried: a re-announcement of
    /// the same bytes is no news, and an author that announces and never serves would
    /// otherwise hold a fetch (and its announced size of the byte budget) each time.
    /// A delta that others announced as theirs while it was in flight is first asked of
    /// them ([`Self::ask_other_claimants`]).
    pub(super) fn give_up(&mut self, hash: ContentHash, now: Millis, out: &mut Vec<Output>) {
        let Some(f) = self.end_fetch(&hash) else { return };
        self.metrics.fetch_failures += 1;
        let Some(f) = self.ask_other_claimants(hash, f, now, out) else { return };
        self.block(hash, now.saturating_add(2 * self.settings.period_ms()));
        match f.kind {
            Kind::State { .. } => self.lanes[f.fragment].state_fetch = None,
            Kind::Delta { .. } => {
                self.delta_fetch_ended(f.fragment, now, out);
                self.listed_failed(f.fragment, hash, now, out);
            }
            Kind::Listed => self.listed_failed(f.fragment, hash, now, out),
        }
    }

    /// A delta's fetch asks only its first announcer: a copier that announces an honest
    /// delta first, as its own, and then never serves it (or serves other bytes) would keep
    /// the real author's delta out, as the hash is then given up. So a fetch that failed is
    /// started again from the announcers it did not ask yet, authors with a current credit
    /// first, until none is left (at most the claim list's length); `None` when it was.
    fn ask_other_claimants(
        &mut self,
        hash: ContentHash,
        f: InFlight,
        now: Millis,
        out: &mut Vec<Output>,
    ) -> Option<InFlight> {
        let Kind::Delta { claims } = &f.kind else { return Some(f) };
        let votes = &self.lanes[f.fragment].votes;
        let (asked, fresh) = claims.split_at(f.asked.min(claims.len()));
        let mut untried: Vec<PeerId> = Vec::new();
        for c in fresh {
            if !asked.iter().any(|a| a.author == c.author) && !untried.contains(&c.author) {
                untried.push(c.author);
            }
        }
        if untried.is_empty() {
            return Some(f);
        }
        // Stable: announcement order within the credited and the others.
        untried.sort_by_key(|a| !votes.counts(a));
        let (fragment, kind, max_len) = (f.fragment, f.kind.clone(), f.max_len);
        self.start_fetch(hash, fragment, kind, untried, max_len, now, out);
        if let Some(g) = self.in_flight.get_mut(&hash) {
            // The time the delta has been waiting counts from its first announcement.
            g.announced_at = f.announced_at;
        }
        None
    }

    /// A delta fetch of fragment `p` ended (arrived or given up): a reconciliation that
    /// waited for the deltas in flight to recompute the swarm's state goes on.
    fn delta_fetch_ended(&mut self, p: usize, now: Millis, out: &mut Vec<Output>) {
        if self.lanes[p].recipe_wait.take().is_some() {
            self.reconcile(p, now, out);
        }
    }

    /// No holder delivered `hash`. An author that signed an announcement of a delta and
    /// then answers that it does not hold it stalls every fetcher at no cost to itself: it
    /// is reported ([`Offence::Unserved`]; strikes add up to a ban). A holder that did not
    /// answer at all (`silent`) has the refusal counted against it by name, and is not
    /// struck: a paused process or an uploader whose cap queues its answers is silent too.
    pub(super) fn on_fetch_failed(
        &mut self,
        from: PeerId,
        hash: ContentHash,
        denied: &[PeerId],
        silent: &[PeerId],
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        let Some(f) = self.in_flight.get(&hash) else { return };
        let deniers: Vec<PeerId> = match &f.kind {
            Kind::Delta { claims } => {
                claims.iter().map(|c| c.author).filter(|a| denied.contains(a)).collect()
            }
            Kind::State { .. } | Kind::Listed => Vec::new(),
        };
        let mut named = 0;
        for &holder in silent.iter().filter(|h| !deniers.contains(h)).take(MAX_NAMED_SILENT) {
            self.metrics.silent_holders += 1;
            self.metrics.refused(holder);
            named += 1;
        }
        if deniers.is_empty() && named == 0 {
            self.metrics.refused(from);
        }
        for author in deniers {
            self.metrics.refused(author);
            let detail = format!("announced delta {hash}, then said it does not hold it");
            misbehaved(out, author, Offence::Unserved, detail);
        }
        self.give_up(hash, now, out)
    }

    /// Removes a fetch from the table, releasing the bytes it held in the budget.
    fn end_fetch(&mut self, hash: &ContentHash) -> Option<InFlight> {
        let f = self.in_flight.remove(hash)?;
        if matches!(f.kind, Kind::Delta { .. } | Kind::Listed) {
            self.in_flight_bytes = self.in_flight_bytes.saturating_sub(f.max_len);
        }
        Some(f)
    }

    /// One timer sweeps all fetch deadlines: a timer per fetch would be a million timer
    /// events per round in a thousand-peer swarm, nearly all for fetches long answered.
    fn arm_sweep(&mut self, now: Millis, out: &mut Vec<Output>) {
        let at = now.saturating_add((self.settings.raw().fetch_timeout_ms / 4).max(1));
        self.sweep_at = Some(at);
        out.push(Output::SetTimer { at, timer: Timer::FetchSweep });
    }

    /// Gives up (and cancels) every fetch past its deadline.
    pub(super) fn sweep(&mut self, now: Millis, out: &mut Vec<Output>) {
        if self.sweep_at.is_none_or(|at| at > now) {
            return;
        }
        self.sweep_at = None;
        let mut expired: Vec<ContentHash> =
            self.in_flight.iter().filter(|(_, f)| f.deadline <= now).map(|(h, _)| *h).collect();
        expired.sort_unstable();
        for hash in expired {
            out.push(Output::CancelFetch { hash });
            self.give_up(hash, now, out);
        }
        if !self.in_flight.is_empty() && self.sweep_at.is_none() {
            self.arm_sweep(now, out);
        }
    }

    pub(super) fn on_fetched(
        &mut self,
        from: PeerId,
        hash: ContentHash,
        bytes: Bytes,
        now: Millis,
        out: &mut Vec<Output>,
    ) {
        if !self.in_flight.contains_key(&hash) {
            return;
        }
        if ContentHash::of(&bytes) != hash {
            let detail = "payload does not match its hash".to_string();
            misbehaved(out, from, Offence::BadPayload, detail);
            self.metrics.rejected += 1;
            return self.give_up(hash, now, out);
        }
        let Some(f) = self.end_fetch(&hash) else { return };
        let counter = match f.kind {
            Kind::Delta { .. } | Kind::Listed => &mut self.metrics.fetched_delta_bytes,
            Kind::State { .. } => &mut self.metrics.fetched_state_bytes,
        };
        *counter += bytes.len() as u64;
        match f.kind {
            Kind::Delta { .. } => {
                self.accept_delta(from, hash, bytes.clone(), &f, now, out);
                self.delta_fetch_ended(f.fragment, now, out);
                if self.lanes[f.fragment].awaits(&hash) {
                    self.accept_listed(from, hash, bytes, &f, now, out);
                }
            }
            Kind::Listed => self.accept_listed(from, hash, bytes, &f, now, out),
            Kind::State { round } => {
                self.accept_state(from, hash, bytes, f.fragment, round, now, out)
            }
        }
    }

    pub(super) fn reject(
        &mut self,
        from: PeerId,
        hash: ContentHash,
        offence: Offence,
        detail: String,
        out: &mut Vec<Output>,
    ) {
        self.metrics.rejected += 1;
        self.note_rejected(hash);
        misbehaved(out, from, offence, detail);
    }

    /// Does not chase payload `hash` again before `until`.
    pub(super) fn block(&mut self, hash: ContentHash, until: Millis) {
        if self.unreachable.len() >= MAX_REJECTED {
            self.unreachable.clear();
        }
        self.unreachable.insert(hash, until);
    }

    /// Whether `hash` was given up on (or blocked) and not to be chased before a later time.
    pub(super) fn blocked(&self, hash: &ContentHash, now: Millis) -> bool {
        self.unreachable.get(hash).is_some_and(|&until| until > now)
    }

    /// Remembers a payload not to fetch again.
    pub(super) fn note_rejected(&mut self, hash: ContentHash) {
        if self.rejected.len() >= MAX_REJECTED {
            self.rejected.clear();
        }
        self.rejected.insert(hash);
    }
}
