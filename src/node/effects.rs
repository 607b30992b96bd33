//! The peer's effects, carried out by the node: timers, snapshots and anchors for the
//! trainer, gossip, fetch tasks (one per hash), anchors on disk, logs, and the trainer's
//! release and finish.

use std::cmp::Reverse;
use std::time::{Duration, Instant};

use atoll_net::BlobHash;
use bytes::Bytes;

use super::worker::ToWorker;
use super::{wire, Loop, MAX_TASKS, SETTLE};
use crate::delta::ContentHash;
use crate::peer::{Effect, PeerEvent};
use crate::proto::{Event, Message, Millis, Output, PeerId};

impl<N: super::Network> Loop<N> {
    pub(super) async fn carry_out(&mut self, effects: Vec<Effect>) {
        let mut queue = effects;
        queue.reverse();
        while let Some(effect) = queue.pop() {
            let out = match effect {
                Effect::Core(out) => out,
                Effect::Offer { hash, payload, pinned } => {
                    self.offer(hash, payload, pinned);
                    continue;
                }
                Effect::Withdraw { hash } => {
                    self.net.pin_blob(&BlobHash(hash.0), false);
                    continue;
                }
                Effect::Release(r) => {
                    self.release(r).await;
                    continue;
                }
                Effect::Finish { anchors } => {
                    self.finish(anchors).await;
                    continue;
                }
            };
            match out {
                Output::SetTimer { at, timer } => self.timers.push(Reverse((at, timer))),
                Output::Snapshot { fragment, round } => {
                    let cmd = ToWorker::Snapshot { fragment, round };
                    if !self.to_worker.push(cmd) {
                        // No trainer any more: nothing trained since.
                        let params = self.peer.protocol().state(fragment).anchor.clone();
                        let ev = Event::Snapshot { fragment, round, params, tokens: 0, steps: 0 };
                        let mut more = self.peer.handle(PeerEvent::Core(ev), self.now());
                        more.reverse();
                        queue.extend(more);
                    }
                }
                Output::Publish { msg, payload } => {
                    // A new delta of ours moved the fragment's residual on: keep it with
                    // the anchors, so a restart continues it.
                    if let Message::Contribution(a) = &msg {
                        if a.origin == self.peer.protocol().me() {
                            let residual = self.peer.protocol().residual(a.fragment as usize);
                            self.disk.save_residual(a.fragment, residual.to_vec());
                        }
                    }
                    // Its payload was offered when it was new (`Effect::Offer`); a repeated
                    // announcement puts it back if atoll-net's store has evicted it since.
                    self.offer(msg.payload_hash(), payload, false);
                    self.publish(msg);
                }
                Output::Fetch { hash, holders, max_len, deadline } => {
                    self.fetch(hash, &holders, max_len, deadline)
                }
                Output::CancelFetch { hash } => self.fetches.cancel(&hash),
                Output::Apply(a) => {
                    self.to_worker.push(ToWorker::Apply(a));
                }
                Output::Weigh { fragment, hash, anchor, own, margin, .. } => {
                    let cmd = ToWorker::Weigh { fragment, hash, anchor, own, margin };
                    if !self.to_worker.push(cmd) {
                        // No trainer any more: the state goes by its votes.
                        let ev = Event::Weighed { fragment, hash, losses: None };
                        let mut more = self.peer.handle(PeerEvent::Core(ev), self.now());
                        more.reverse();
                        queue.extend(more);
                    }
                }
                Output::Merged(r) => {
                    self.status.merges += 1;
                    self.disk.record_merge(self.clock.unix_ms(), r.clone());
                    tracing::debug!(
                        fragment = r.fragment,
                        round = r.round,
                        merged = r.merged.len(),
                        late = r.late,
                        "merged"
                    );
                    self.disk.save_state(self.peer.protocol().state(r.fragment).clone());
                }
                Output::Banked { fragment, .. } => {
                    let residual = self.peer.protocol().residual(fragment);
                    self.disk.save_residual(fragment as u32, residual.to_vec());
                }
                Output::Skipped { fragment, round, contested } => {
                    self.status.skipped += 1;
                    let why = if contested { "nothing agreed" } else { "no quorum" };
                    tracing::debug!(fragment, round, why, "round skipped");
                }
                Output::Adopted { fragment, round, previous_round, .. } => {
                    self.status.adopted += 1;
                    self.status.recomputed = self.peer.protocol().metrics().recomputed;
                    tracing::info!(fragment, round, previous_round, "adopted the swarm's state");
                    self.disk.save_state(self.peer.protocol().state(fragment).clone());
                }
                Output::Misbehaved { peer, offence, detail } => {
                    *self.status.rejected.entry(offence.as_str().to_owned()).or_default() += 1;
                    let libp2p_id = self.peers.get(&peer).copied();
                    // One line per offender and offence per minute; the counts go to status.json.
                    if let Some(suppressed) =
                        self.reported.check(peer, offence.as_str(), Instant::now())
                    {
                        let id = libp2p_id.map(|p| p.to_string()).unwrap_or_default();
                        tracing::warn!(peer = %id, %offence, %detail, suppressed, "peer misbehaved");
                    }
                    if let Some(p) = libp2p_id {
                        self.net.penalize(p, offence.as_str()).await;
                    }
                }
            }
        }
    }

    /// Keeps an offered payload in atoll-net's store (shared, not copied) for peers that
    /// fetch it. A payload kept already (an adopted state was stored by its fetch) is not
    /// chunk-hashed again: 8 bytes per parameter. A pinned one (an own delta others may
    /// still fetch) stays until withdrawn: an author that answers "not here" for a delta
    /// it announced is struck (`unserved`), so a least-recently-used store filling up in a
    /// busy round must not drop it.
    fn offer(&mut self, hash: ContentHash, payload: Bytes, pinned: bool) {
        let hash = BlobHash(hash.0);
        if !self.net.has_blob(&hash) {
            if let Err(e) = self.net.put_blob(payload) {
                tracing::warn!(error = %e, "cannot store a payload for serving");
            }
        }
        if pinned && !self.net.pin_blob(&hash, true) {
            tracing::warn!(%hash, "cannot keep an own delta from eviction: the payload store is too small");
        }
    }

    /// Gossips an announcement.
    pub(super) fn publish(&mut self, msg: Message) {
        let payload = wire::encode(&self.run_id.0, &msg);
        let net = self.net.clone();
        self.spawn(async move {
            if let Err(e) = net.publish(payload).await {
                tracing::debug!(error = %e, "announcement not published");
            }
        });
    }

    /// Fetches `hash` from its holders, all at once: atoll-net spreads the chunks over
    /// them, hedges slow ones and resumes from the others when one leaves (a late joiner's
    /// state comes from several donors). One task per hash, stopped at the deadline.
    pub(super) fn fetch(
        &mut self,
        hash: ContentHash,
        holders: &[PeerId],
        max_len: u64,
        deadline: Millis,
    ) {
        let net = self.net.clone();
        let named: Vec<(PeerId, atoll_net::PeerId)> =
            holders.iter().filter_map(|p| Some((*p, *self.peers.get(p)?))).collect();
        let sources: Vec<atoll_net::PeerId> = named.iter().map(|(_, p)| *p).collect();
        let from = holders.first().copied().unwrap_or(PeerId(0));
        let budget = Duration::from_millis(deadline.saturating_sub(self.now()));
        let holders = sources.len();
        self.fetches.start(hash, async move {
            let began = Instant::now();
            let fetch = net.fetch(BlobHash(hash.0), sources, max_len);
            match tokio::time::timeout(budget, fetch).await {
                Ok(Ok(bytes)) => {
                    let ms = began.elapsed().as_millis();
                    tracing::trace!(%hash, holders, bytes = bytes.len(), ms, "fetched");
                    Event::Fetched { from, hash, bytes }
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "fetch failed");
                    let (denied, silent) = match &e {
                        atoll_net::NetError::Fetch(f) => (f.denied(), f.silent()),
                        _ => (&[][..], &[][..]),
                    };
                    let ours = |of: &[atoll_net::PeerId]| -> Vec<PeerId> {
                        named.iter().filter(|(_, p)| of.contains(p)).map(|(id, _)| *id).collect()
                    };
                    Event::FetchFailed { from, hash, denied: ours(denied), silent: ours(silent) }
                }
                Err(_) => Event::FetchFailed { from, hash, denied: Vec::new(), silent: Vec::new() },
            }
        });
    }

    /// Runs `task` in the background, tracked; at most [`MAX_TASKS`] at once (the newest
    /// is dropped beyond that: a publish or a diagnosis, both best effort).
    pub(super) fn spawn(&mut self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.reap();
        if self.tasks.len() < MAX_TASKS {
            self.tasks.spawn(task);
        } else {
            tracing::debug!("too many background tasks; one dropped");
        }
    }

    /// Forgets finished background tasks.
    pub(super) fn reap(&mut self) {
        while self.tasks.try_join_next().is_some() {}
    }

    /// Lets background tasks finish (announcements still going out), for a moment.
    pub(super) async fn settle(&mut self) {
        let all = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(SETTLE, all).await.is_err() {
            self.tasks.abort_all();
        }
    }
}
