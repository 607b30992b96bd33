//! A peer that does not train (`atoll run --no-train`, a bootstrap/relay peer): it serves
//! the network, and like a training peer it publishes heartbeats, keeps the table of the
//! run's peers (it sees the whole swarm) and writes `status.json` and `swarm.json` on a
//! disk thread of its own.

use std::future::Future;
use std::path::PathBuf;

use atoll_net::NetEvent;
use tokio::sync::mpsc;

use super::heartbeats::Beacon;
use super::{disk, Network, NodeError, STATUS_PERIOD};
use crate::rundir::status::unix_ms;
use crate::web::Board;

/// Serves until `stop` resolves; every network event is shown to `on_event` (the command
/// line logs them). `board` (the status page and metrics, when served) gets each status.
/// Writes the final status (`running: false`) before returning.
pub async fn serve_without_training<N: Network>(
    net: N,
    events: &mut mpsc::Receiver<NetEvent>,
    run_dir: PathBuf,
    board: Option<Board>,
    stop: impl Future<Output = ()>,
    mut on_event: impl FnMut(&NetEvent),
) -> Result<(), NodeError> {
    let endpoints = board.as_ref().map(Board::endpoints).unwrap_or_default();
    let disk = disk::Disk::start(run_dir, endpoints).map_err(NodeError::Thread)?;
    let show = |running: bool, stats: &atoll_net::NetStats| {
        if let Some(b) = &board {
            b.set_status(running, stats.clone(), None);
        }
    };
    let me = net.peer_id();
    let mut beacon = Beacon::new(unix_ms());
    let mut tick = tokio::time::interval(STATUS_PERIOD);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => break,
            _ = tick.tick() => {
                let stats = net.stats().await?;
                let now = unix_ms();
                if let Some(bytes) = beacon.due(&stats, None, now) {
                    let ok = net.publish_heartbeat(bytes).await.is_ok();
                    beacon.sent(ok, now, stats.run_peers.len());
                }
                if let Some(view) = beacon.tick(&me, &stats, None, now) {
                    disk.write_swarm(view);
                }
                show(true, &stats);
                disk.write_net_status(true, stats);
            }
            Some(event) = events.recv() => {
                match &event {
                    NetEvent::Heartbeat { author, payload } => {
                        if let Some(reason) = beacon.heard(*author, payload, unix_ms()) {
                            net.penalize(*author, reason).await;
                        }
                    }
                    NetEvent::RunPeerJoined(_) => beacon.soon(unix_ms()),
                    _ => {}
                }
                on_event(&event);
            }
        }
    }
    let stats = net.stats().await?;
    disk.write_swarm(beacon.view(&me, unix_ms()));
    show(false, &stats);
    disk.write_net_status(false, stats);
    disk.finish();
    Ok(())
}
