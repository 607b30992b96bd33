//! The node's event loop: one biased `select!` (STYLE 5) over a stop request, the
//! `--duration` deadline, the trainer's reports, the protocol core's timers, re-announcements
//! for peers that joined, network events, finished fetches and the status tick; and the
//! status fields it refreshes from the protocol core.

use std::cmp::Reverse;
use std::time::Duration;

use atoll_net::NetEvent;
use tokio::sync::mpsc;

use super::worker::{FromWorker, ToWorker};
use super::{Loop, Network, NodeError, NodeReport, STATUS_PERIOD};
use crate::proto::{Event, Millis};
use crate::rundir::status;

impl<N: Network> Loop<N> {
    pub(super) fn now(&self) -> Millis {
        status::unix_ms().saturating_sub(self.epoch)
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
        let started = self.proto.start(self.now());
        self.carry_out(started).await;
        self.refresh_status();
        let mut tick = tokio::time::interval(STATUS_PERIOD);
        loop {
            // A joiner starts training the moment it holds the swarm's anchors, not at the
            // next status tick.
            if self.holding.is_some() {
                self.release_if_caught_up().await;
            }
            let next_timer = self.timers.peek().map(|Reverse((at, _))| *at);
            let sleep_ms = next_timer.map(|at| at.saturating_sub(self.now())).unwrap_or(60_000);
            let reannounce_ms = self.reannounce_at.map(|at| at.saturating_sub(self.now()));
            tokio::select! {
                biased;
                _ = &mut stop, if !self.finishing => self.finish().await,
                _ = async { tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)).await }, if deadline.is_some() && !self.finishing && !stopping => {
                    tracing::info!("--duration reached; training stops");
                    stopping = true;
                    let _ = self.to_worker.send(ToWorker::StopTraining).await;
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
                        let outs = self.proto.handle(Event::Timer(t), now);
                        self.carry_out(outs).await;
                    }
                }
                _ = tokio::time::sleep(Duration::from_millis(reannounce_ms.unwrap_or(0))), if reannounce_ms.is_some() => {
                    self.reannounce_at = self.reannounce_late.take();
                    self.announce_states().await;
                }
                Some(ev) = events.recv() => self.on_net(ev).await,
                Some(ev) = self.fetches.next(), if !self.fetches.is_empty() => {
                    let began = std::time::Instant::now();
                    let outs = self.proto.handle(ev, self.now());
                    self.carry_out(outs).await;
                    tracing::trace!(ms = began.elapsed().as_millis(), "fetched payload handled");
                }
                _ = tick.tick() => {
                    self.release_if_caught_up().await;
                    self.refresh_status();
                    self.reap();
                    if let Ok(stats) = self.net.stats().await {
                        self.beat(&stats).await;
                        if let Some(b) = &self.board {
                            b.set_status(true, stats.clone(), Some(self.status.clone()));
                        }
                        self.disk.write_status(true, stats, self.status.clone());
                    }
                    if self.status.trained && !self.finishing
                        && self.now().saturating_sub(self.last_change)
                            > self.quiet_ms()
                    {
                        tracing::info!("trained and the swarm is quiet; finishing");
                        self.finish().await;
                    }
                }
            }
        }
    }

    /// Announces the state of every fragment that has merged at least once.
    /// Says again where this peer is (states) and what it contributed recently, so that a
    /// newcomer can catch up and credit the voters at once instead of a period later.
    async fn announce_states(&mut self) {
        let outs = self.proto.reannounce(self.now());
        self.carry_out(outs).await;
    }

    fn refresh_status(&mut self) {
        let p = self.proto.settings().raw().fragments;
        self.status.round = (0..p).map(|i| self.proto.state(i).round).collect();
        self.status.anchor_hashes = (0..p).map(|i| self.proto.state_hash(i).to_string()).collect();
        let m = self.proto.metrics();
        self.status.refusals = m.refusals().iter().map(|&(k, n)| (k.to_owned(), n)).collect();
        self.status.nonfinite_dropped = m.nonfinite_dropped;
    }
}
