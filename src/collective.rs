//! A synchronous group over the network: the all-reduce of the baselines atoll is measured
//! against (data-parallel: gradients every inner step; synchronous DiLoCo: outer deltas
//! every H steps).
//!
//! Each member stores its buffer as a payload, announces `(step, hash, length)` on the
//! run's gossip topic (again every second until everyone's is in: a subscription may not
//! have reached everyone yet), fetches every other member's buffer and takes the mean in
//! member order (sorted peer ids), so every member computes the same bits. Strict: a step
//! waits for every member up to the timeout, then fails. Elastic: members missing at the
//! timeout leave the group and the step goes on with the rest (what elastic data-parallel
//! does when a worker dies); a buffer no member can deliver any more (its author died
//! after announcing it) is left out the same way. Membership only shrinks: a member that
//! finds the others went on without it (they announce later steps while it waits) is
//! evicted and stops ([`CollectiveError::Evicted`]). Bytes travel through atoll-net like atoll's own deltas, so
//! they are counted, capped and reported the same way.

use std::collections::BTreeMap;
use std::time::Duration;

use atoll_net::{BlobHash, NetEvent, PeerId};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::node::Network;

/// Announcements kept while the group forms (members that formed first already announce).
const EARLY: usize = 256;
/// Members are named by a bit each in announcements (their index at formation).
pub const MAX_GROUP: usize = 64;
/// How often a member announces its buffer again while it waits.
const REANNOUNCE: Duration = Duration::from_secs(1);

/// Why a group could not form or a step could not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveError {
    #[error("a group has at most {MAX_GROUP} members, not {0}")]
    Size(usize),
    #[error("only {found} of the other {want} peers joined within {waited:?}")]
    Form { found: usize, want: usize, waited: Duration },
    #[error("step {step}: {missing} member(s) sent nothing within {waited:?} (strict barrier)")]
    Barrier { step: u64, missing: usize, waited: Duration },
    #[error("step {step}: the buffer of {peer}: {reason}")]
    Fetch { step: u64, peer: PeerId, reason: String },
    #[error("step {step}: the other members went on without this one (evicted)")]
    Evicted { step: u64 },
    #[error("the network has shut down")]
    Closed,
}

/// One synchronous group.
pub struct Group<N> {
    net: N,
    events: mpsc::Receiver<NetEvent>,
    run: [u8; 32],
    me: PeerId,
    /// The members at formation (sorted): bit `i` of an announcement is `formed[i]`.
    formed: Vec<PeerId>,
    members: Vec<PeerId>,
    /// A member announced a group without this peer.
    evicted: bool,
    elastic: bool,
    timeout: Duration,
    /// Announcements heard: `(step, peer) → (hash, length)`, for this step and the next.
    heard: BTreeMap<(u64, PeerId), (BlobHash, u64)>,
    /// The latest step each member was heard announcing.
    latest: BTreeMap<PeerId, u64>,
    /// The buffers the latest mean was taken over, by member.
    averaged: Vec<(PeerId, BlobHash)>,
    /// This peer's buffer of the previous step, announced again with the current one.
    prev: Option<BlobHash>,
    step: u64,
}

impl<N: Network> Group<N> {
    /// Waits until `size − 1` other peers of the run are connected; they and this peer are
    /// the group.
    pub async fn form(
        net: N,
        mut events: mpsc::Receiver<NetEvent>,
        run: [u8; 32],
        size: usize,
        elastic: bool,
        timeout: Duration,
    ) -> Result<Group<N>, CollectiveError> {
        let me = net.peer_id();
        if size > MAX_GROUP {
            return Err(CollectiveError::Size(size));
        }
        let want = size.saturating_sub(1);
        let mut others: Vec<PeerId> = Vec::new();
        let mut early = Vec::new();
        let deadline = Instant::now() + timeout;
        while others.len() < want {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Some(NetEvent::RunPeerJoined(p))) if p != me && !others.contains(&p) => {
                    others.push(p)
                }
                Ok(Some(ev @ NetEvent::Announcement { .. })) if early.len() < EARLY => {
                    early.push(ev)
                }
                Ok(Some(_)) => {}
                Ok(None) => return Err(CollectiveError::Closed),
                Err(_) => {
                    let found = others.len();
                    return Err(CollectiveError::Form { found, want, waited: timeout });
                }
            }
        }
        let mut members = others;
        members.push(me);
        members.sort();
        let mut group = Group {
            net,
            events,
            run,
            me,
            formed: members.clone(),
            members,
            evicted: false,
            elastic,
            timeout,
            heard: BTreeMap::new(),
            latest: BTreeMap::new(),
            averaged: Vec::new(),
            prev: None,
            step: 0,
        };
        for ev in early {
            group.on_event(ev);
        }
        Ok(group)
    }

    /// The members, sorted (this peer included).
    pub fn members(&self) -> &[PeerId] {
        &self.members
    }

    /// The longest wait at a barrier from now on.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Whose buffers the latest mean averaged, with their hashes (this peer's included).
    pub fn averaged(&self) -> &[(PeerId, BlobHash)] {
        &self.averaged
    }

    /// A member announced a group without this peer, or step `step + 2` or later (it
    /// could not have finished `step + 1` while waiting for this peer's buffer).
    fn left_behind(&self, step: u64) -> bool {
        self.evicted || self.latest.values().any(|&s| s >= step + 2)
    }

    /// This peer's members as bits over the formation list.
    fn member_bits(&self) -> u64 {
        self.formed
            .iter()
            .enumerate()
            .filter(|(_, p)| self.members.contains(p))
            .fold(0, |bits, (i, _)| bits | 1 << i)
    }

    /// The mean over the group of every member's `values` for `step` (steps increase).
    pub async fn mean(&mut self, step: u64, values: &[f32]) -> Result<Vec<f32>, CollectiveError> {
        self.step = step;
        self.heard.retain(|(s, _), _| *s >= step);
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let len = bytes.len() as u64;
        let hash = BlobHash::of(&bytes);
        self.net.put_blob(Bytes::from(bytes)).map_err(|_| CollectiveError::Closed)?;
        self.heard.insert((step, self.me), (hash, len));
        // What arrived since the last step first: a member may have dropped this one.
        while let Ok(ev) = self.events.try_recv() {
            self.on_event(ev);
        }
        let mut deadline = Instant::now() + self.timeout;
        let mut attempt = 0u64;
        let mut announce_at = Instant::now();
        let (mut last, mut extended) = (Instant::now(), false);
        loop {
            let missing: Vec<PeerId> = self
                .members
                .iter()
                .filter(|p| !self.heard.contains_key(&(step, **p)))
                .copied()
                .collect();
            if self.elastic && self.left_behind(step) {
                return Err(CollectiveError::Evicted { step });
            }
            // Announced at least once: the others may not have heard this buffer yet.
            if missing.is_empty() && attempt > 0 {
                break;
            }
            let now = Instant::now();
            // This process was stopped (or starved) while it waited: the others' news of
            // that time may have been lost with the connection. One more timeout to hear
            // whether they went on without it before it drops anyone.
            let stalled = now.duration_since(last) > self.timeout / 2 + REANNOUNCE;
            last = now;
            if stalled && now >= deadline && !extended {
                extended = true;
                deadline = now + self.timeout;
                announce_at = now;
            }
            if now >= deadline {
                // What arrived while this process could not run (it was stopped, or the
                // machine busy) decides whether the others are silent or went on.
                let mut fresh = false;
                while let Ok(ev) = self.events.try_recv() {
                    fresh |= self.on_event(ev);
                }
                if fresh {
                    continue;
                }
                if !self.elastic {
                    let (n, waited) = (missing.len(), self.timeout);
                    return Err(CollectiveError::Barrier { step, missing: n, waited });
                }
                // A missing member heard at a later step finished this one without us.
                if missing.iter().any(|p| self.latest.get(p).is_some_and(|&s| s > step)) {
                    return Err(CollectiveError::Evicted { step });
                }
                tracing::warn!(
                    step,
                    ?missing,
                    "members sent nothing in time; going on without them"
                );
                self.members.retain(|p| !missing.contains(p));
                break;
            }
            if now >= announce_at {
                let members = self.member_bits();
                let wire = Wire { run: self.run, step, members, hash, len, prev: self.prev };
                let msg = wire.encode(attempt);
                if let Err(e) = self.net.publish(msg).await {
                    tracing::debug!(error = %e, step, "announcement not published yet");
                }
                attempt += 1;
                announce_at = now + REANNOUNCE;
            }
            if missing.is_empty() {
                break;
            }
            let wake = announce_at.min(deadline);
            match tokio::time::timeout_at(wake, self.events.recv()).await {
                Ok(Some(ev)) => {
                    self.on_event(ev);
                }
                Ok(None) => return Err(CollectiveError::Closed),
                Err(_) => {}
            }
        }
        self.prev = Some(hash);
        self.reduce(step, values).await
    }

    /// Tells the others this member has the group's last mean, then keeps its node up —
    /// serving its last buffer — until every other member said the same, or the timeout.
    /// The members stop after the same mean, but one that fetched faster would otherwise
    /// leave while a slower one (a capped upload) still fetches its buffer. The news is an
    /// announcement of the step after the last, with an all-zero buffer hash.
    pub async fn finish(&mut self) {
        let done = self.step + 1;
        let deadline = Instant::now() + self.timeout;
        let mut announce_at = Instant::now();
        loop {
            let waiting = self
                .members
                .iter()
                .any(|p| *p != self.me && self.latest.get(p).is_none_or(|&s| s < done));
            let now = Instant::now();
            if now >= announce_at {
                let members = self.member_bits();
                // `prev` and its length still name the last buffer, for a member that
                // missed its announcement (see `on_event`).
                let len = self.heard.get(&(self.step, self.me)).map_or(0, |&(_, len)| len);
                let (hash, prev) = (BlobHash([0; 32]), self.prev);
                let wire = Wire { run: self.run, step: done, members, hash, len, prev };
                if let Err(e) = self.net.publish(wire.encode(0)).await {
                    tracing::debug!(error = %e, "end of the group not published yet");
                }
                announce_at = now + REANNOUNCE;
            }
            if !waiting {
                return;
            }
            if now >= deadline {
                tracing::warn!(step = self.step, "members did not say they finished; leaving");
                return;
            }
            match tokio::time::timeout_at(announce_at.min(deadline), self.events.recv()).await {
                // A member that left fetches nothing more from this one: its word is not
                // waited for (the last member to finish leaves as soon as it has said so,
                // and its announcement may not get out before its node stops).
                Ok(Some(NetEvent::RunPeerLeft(p))) if self.members.contains(&p) => {
                    self.latest.insert(p, done);
                }
                Ok(Some(ev)) => {
                    self.on_event(ev);
                }
                Ok(None) => return,
                Err(_) => {}
            }
        }
    }

    /// Records an announcement; true when it completes a member's buffer for this step.
    fn on_event(&mut self, ev: NetEvent) -> bool {
        let NetEvent::Announcement { author: Some(author), payload, .. } = ev else {
            return false;
        };
        let Some(Wire { run, step, members, hash, len, prev }) = Wire::decode(&payload) else {
            return false;
        };
        if run != self.run || !self.members.contains(&author) {
            return false;
        }
        // Its group: without this peer, it was evicted; without another member, that one
        // missed a barrier there and is dropped here too (it would be, at its timeout).
        for (i, p) in self.formed.iter().enumerate() {
            if members & (1 << i) == 0 {
                if *p == self.me {
                    self.evicted = true;
                } else if self.elastic {
                    self.members.retain(|m| m != p);
                }
            }
        }
        let latest = self.latest.entry(author).or_insert(step);
        *latest = (*latest).max(step);
        // A member one step on names the buffer it had for ours: a first announcement lost
        // before the gossip mesh formed is recovered from the next one.
        let mut completed = false;
        if let (true, Some(prev)) = (step == self.step + 1, prev) {
            completed = !self.heard.contains_key(&(self.step, author));
            self.heard.entry((self.step, author)).or_insert((prev, len));
        }
        let fresh = step == self.step || step == self.step + 1;
        let new = fresh && self.heard.insert((step, author), (hash, len)).is_none();
        completed || (new && step == self.step)
    }
}

mod reduce;
mod wire;
use wire::Wire;

#[cfg(test)]
mod tests;
