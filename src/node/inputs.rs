//! What the node's event loop does with its inputs: reports of the training thread and
//! events of the network (announcements into the protocol core, peers joining, abuse).

use std::time::Instant;

use atoll_net::NetEvent;
use atoll_net::{BlobHash, RejectReason};

use super::worker::FromWorker;
use super::{proto_peer, wire, Loop};
use crate::manifest::{Manifest, RunId};
use crate::peer::PeerEvent;
use crate::proto::{Event, Offence, PeerId};

/// Most protocol ids mapped back to libp2p peer ids (fetch sources, penalties).
const MAX_PEER_IDS: usize = 16_384;

impl<N: super::Network> Loop<N> {
    pub(super) async fn on_worker(&mut self, msg: FromWorker) {
        match msg {
            FromWorker::Snapshot { fragment, round, params, tokens, steps } => {
                let ev = Event::Snapshot { fragment, round, params, tokens, steps };
                let effects = self.peer.handle(PeerEvent::Core(ev), self.now());
                self.carry_out(effects).await;
            }
            FromWorker::Weighed { fragment, hash, losses, margin } => {
                tracing::debug!(fragment, %hash, loss = losses.offered, own = losses.own, "weighed a state");
                if !losses.passes(margin) {
                    tracing::info!(
                        fragment, %hash, loss = losses.offered, own = losses.own,
                        "refused the swarm's state: worse than this peer's own on its validation data"
                    );
                }
                let ev = Event::Weighed { fragment, hash, losses: Some(losses) };
                let effects = self.peer.handle(PeerEvent::Core(ev), self.now());
                self.carry_out(effects).await;
            }
            FromWorker::Step { step, tokens, loss, tokens_per_s } => {
                if self.status.join_ms.is_none() {
                    let ms = self.clock.unix_ms().saturating_sub(self.started_unix_ms);
                    self.status.join_ms = Some(ms);
                    let proto = self.peer.protocol();
                    let p = proto.settings().raw().fragments;
                    self.status.join_rounds = (0..p).map(|i| proto.state(i).round).collect();
                    tracing::info!(ms, "first inner step");
                }
                self.status.step = step;
                self.status.tokens = tokens;
                self.status.tokens_per_s = tokens_per_s;
                let effects = self.peer.handle(PeerEvent::Stepped, self.now());
                self.carry_out(effects).await;
                if let Some(loss) = loss {
                    self.status.loss = Some(loss);
                    if let Some(b) = &self.board {
                        b.record_loss(step, f64::from(loss));
                    }
                }
            }
            FromWorker::Validation(r) => {
                self.status.val_bpb = Some(r.val_bpb);
                self.status.tokens = r.tokens;
                if let Some(b) = &self.board {
                    b.record_val_bpb(r.step, r.val_bpb);
                }
                tracing::info!(step = r.step, val_bpb = format!("{:.3}", r.val_bpb), "validation");
            }
            FromWorker::Trained { step } => {
                self.status.trained = true;
                self.status.step = step;
                let effects = self.peer.handle(PeerEvent::Trained, self.now());
                self.carry_out(effects).await;
                tracing::info!(step, "training done; merging until the swarm is quiet");
            }
            FromWorker::Finished { .. } | FromWorker::Failed(_) => {}
        }
    }

    pub(super) async fn on_net(&mut self, ev: NetEvent) {
        match ev {
            NetEvent::Announcement { from, author, payload } => {
                // Messages are signed (strict validation), so the author is known and is the
                // one credited; a forwarder (`from`) never is.
                let Some(sender) = author else {
                    tracing::debug!(peer = %from, "unsigned announcement ignored");
                    return;
                };
                if self.allow.as_ref().is_some_and(|a| !a.contains(&sender)) {
                    // atoll-net disconnects such peers; whatever slipped through is ignored.
                    return;
                }
                match wire::decode(&payload) {
                    Ok((run, msg)) if run == self.run_id.0 => {
                        let id = proto_peer(&sender);
                        self.remember_peer(id, sender);
                        let ev = PeerEvent::Core(Event::Message { from: id, msg });
                        let effects = self.peer.handle(ev, self.now());
                        self.carry_out(effects).await;
                    }
                    Ok((run, _)) => self.on_foreign(sender, run),
                    Err(e) => {
                        let offence = Offence::BadPayload.as_str();
                        if let Some(suppressed) =
                            self.reported.check(proto_peer(&sender), offence, Instant::now())
                        {
                            tracing::warn!(peer = %sender, error = %e, suppressed, "malformed protocol message");
                        }
                        self.net.report(sender, RejectReason::Malformed).await;
                    }
                }
            }
            NetEvent::Heartbeat { author, payload } => self.on_heartbeat(author, &payload).await,
            NetEvent::RunPeerJoined(p) => {
                self.beacon.soon(self.clock.unix_ms());
                self.remember_peer(proto_peer(&p), p);
                let effects = self.peer.handle(PeerEvent::RunPeerJoined, self.now());
                self.carry_out(effects).await;
            }
            NetEvent::RunPeerLeft(_) => {}
            NetEvent::PeerPenalised { peer, reason } => {
                tracing::warn!(%peer, ?reason, "peer penalised");
            }
            NetEvent::UploadAbuse { peer, refused } => {
                tracing::warn!(%peer, refused, "peer keeps asking for more than its share");
                self.net.penalize(peer, "upload_abuse").await;
            }
            other => tracing::debug!(event = ?other, "network event"),
        }
    }

    /// A message of another run manifest: refused; the first one from each peer makes us
    /// fetch its manifest and log what differs.
    pub(super) fn on_foreign(&mut self, peer: atoll_net::PeerId, run: [u8; 32]) {
        self.status.foreign_messages += 1;
        self.status.last_foreign_unix_ms = Some(self.clock.unix_ms());
        if self.foreign.len() >= 1024 || !self.foreign.insert((peer, run)) {
            return;
        }
        let net = self.net.clone();
        let ours = self.manifest.clone();
        self.spawn(async move {
            let max = crate::manifest::MAX_BYTES as u64;
            let theirs = net.fetch(BlobHash(run), vec![peer], max).await;
            let diff = match theirs.map(|b| Manifest::from_bytes(&b)) {
                Ok(Ok(m)) => m.diff(&ours).join("; "),
                Ok(Err(e)) => format!("its manifest is invalid: {e}"),
                Err(e) => format!("its manifest could not be fetched: {e}"),
            };
            tracing::warn!(
                %peer, run = %RunId(run),
                "refusing messages of a peer with another run manifest (theirs ≠ ours): {diff}"
            );
        });
    }

    /// Maps a protocol id back to its libp2p id; bounded (ids of departed peers go first
    /// when it is full: the map is rebuilt from the peers heard since).
    fn remember_peer(&mut self, id: PeerId, peer: atoll_net::PeerId) {
        if self.peers.len() >= MAX_PEER_IDS && !self.peers.contains_key(&id) {
            self.peers.clear();
        }
        self.peers.insert(id, peer);
    }
}
