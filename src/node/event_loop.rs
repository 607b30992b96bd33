//! The node's event loop: one biased `select!` (STYLE 5) over a stop request, the
//! `--duration` deadline, the trainer's reports, the protocol core's timers, the peer's own
//! wake-ups (re-announcements, a joiner's wait, the quiet time), network events, finished
//! fetches and the status tick; and the status fields it refreshes from the protocol core.

use std::cmp::Reverse;
use std::time::Duration;

use atoll_net::NetEvent;
use tokio::sync::mpsc;

use super::worker::{FromWorker, ToWorker};
use super::{Loop, Network, NodeError, NodeReport, STATUS_PERIOD};
use crate::peer::PeerEvent;
use crate::proto::{Event, Millis};
use crate::rundir::ledger;

impl<N: Network> Loop<N> {
    pub(super) fn now(&self) -> Millis {
        self.clock.unix_ms().saturating_sub(self.epoch)
    }

    pub(super) async fn drive(
        &mut self,
        events: &mut mpsc::Receiver<NetEvent>,
        mut from_worker: mpsc::Receiver<FromWorker>,
        duration: Option<Duration>,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<NodeReport, NodeError> {
        tokio::pin!(stop);
        let deadline = duration.map(|d| tokio::time::Instant::now() + d);
        let mut stopping = false;
        let started = self.peer.start(self.now());
        self.carry_out(started).await;
        self.refresh_status();
        let mut tick = tokio::time::interval(STATUS_PERIOD);
        loop {
            // What the clock decides (a joiner's release, re-announcements, finishing once
            // the swarm is quiet), before waiting for anything else.
            let effects = self.peer.poll(self.now());
            self.carry_out(effects).await;
            let next_timer = self.timers.peek().map(|Reverse((at, _))| *at);
            let sleep_ms = next_timer.map(|at| at.saturating_sub(self.now())).unwrap_or(60_000);
            let poll_ms = self.peer.next_poll().map(|at| at.saturating_sub(self.now()).max(1));
            // A sender to wait on for room, only while commands wait for the trainer.
            let to_worker = self.to_worker.waiting().then(|| self.to_worker.sender());
            tokio::select! {
                biased;
                _ = &mut stop, if !self.peer.finishing() => {
                    let effects = self.peer.handle(PeerEvent::Stop, self.now());
                    self.carry_out(effects).await;
                }
                _ = async { tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)).await }, if deadline.is_some() && !self.peer.finishing() && !stopping => {
                    tracing::info!("--duration reached; training stops");
                    stopping = true;
                    self.to_worker.push(ToWorker::StopTraining);
                }
                // Room for the commands waiting for a trainer that was in a long step.
                Some(Ok(permit)) = async { Some(to_worker.as_ref()?.reserve().await) }, if to_worker.is_some() => {
                    drop(permit);
                    self.to_worker.flush();
                }
                msg = from_worker.recv() => match msg {
                    Some(FromWorker::Finished { step, tokens, val_loss, val_bpb }) => {
                        self.status.final_val_loss = Some(val_loss);
                        self.status.final_val_bpb = Some(val_bpb);
                        self.status.step = step;
                        self.status.tokens = tokens;
                        self.save_anchors();
                        return Ok(NodeReport {
                            step, tokens, final_val_loss: val_loss, final_val_bpb: val_bpb,
                            anchor_hashes: self.status.anchor_hashes.clone(),
                        });
                    }
                    Some(FromWorker::Failed(e)) => return Err(NodeError::Training(e)),
                    Some(other) => self.on_worker(other).await,
                    None => return Err(NodeError::WorkerGone),
                },
                _ = tokio::time::sleep(Duration::from_millis(sleep_ms)), if next_timer.is_some() => {
                    let now = self.now();
                    while let Some(Reverse((at, t))) = self.timers.peek().copied() {
                        if at > now { break; }
                        self.timers.pop();
                        let effects = self.peer.handle(PeerEvent::Core(Event::Timer(t)), now);
                        self.carry_out(effects).await;
                    }
                }
                // Wakes the loop for the peer's next poll (at the top).
                _ = tokio::time::sleep(Duration::from_millis(poll_ms.unwrap_or(0))), if poll_ms.is_some() => {}
                Some(ev) = events.recv() => self.on_net(ev).await,
                Some(ev) = self.fetches.next(), if !self.fetches.is_empty() => {
                    let began = std::time::Instant::now();
                    let effects = self.peer.handle(PeerEvent::Core(ev), self.now());
                    self.carry_out(effects).await;
                    tracing::trace!(ms = began.elapsed().as_millis(), "fetched payload handled");
                }
                _ = tick.tick() => {
                    self.refresh_status();
                    self.reap();
                    if let Ok(stats) = self.net.stats().await {
                        self.beat(&stats).await;
                        if let Some(b) = &self.board {
                            b.set_status(true, stats.clone(), Some(self.status.clone()));
                        }
                        self.disk.write_status(true, stats, self.status.clone());
                    }
                }
            }
        }
    }

    fn refresh_status(&mut self) {
        let proto = self.peer.protocol();
        let p = proto.settings().raw().fragments;
        self.status.round = (0..p).map(|i| proto.state(i).round).collect();
        self.status.anchor_hashes = (0..p).map(|i| proto.state_hash(i).to_string()).collect();
        let m = proto.metrics();
        self.status.refusals = m.refusals().iter().map(|&(k, n)| (k.to_owned(), n)).collect();
        let name = |p| self.peers.get(&p).map_or_else(|| ledger::peer_hex(p), |id| id.to_string());
        self.status.refused_from =
            m.most_refused(8).into_iter().map(|(p, n)| (name(p), n)).collect();
        self.status.nonfinite_dropped = m.nonfinite_dropped;
        self.status.weighed = m.weighed_states;
        self.status.payload_bytes =
            m.payload_bytes().iter().map(|&(k, n)| (k.to_owned(), n)).collect();
        self.status.state_fetch_causes =
            m.state_fetch_causes.named().iter().map(|&(k, n)| (k.to_owned(), n)).collect();
        self.status.published = m.published;
        self.status.period = (0..p).map(|i| proto.state(i).sampling.period).collect();
        (self.status.banked, self.status.unsent) = (m.banked, m.unsent);
    }
}
