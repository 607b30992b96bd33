//! Starting and stopping a node: builds the swarm, waits for its listeners, hands the
//! swarm to its own task and returns the client, the event stream and the stop handle.

mod dial_failures;
mod dials;
mod discovery;
mod event_loop;
mod heartbeats;
mod hygiene;
mod members;
mod nat;
mod peers;
mod stats;
mod swarm_events;
mod uploads;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::SwarmEvent;
use libp2p::{gossipsub, Multiaddr, PeerId, Swarm, SwarmBuilder};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::info;

use crate::announce::topic_name;
use crate::behaviour::Behaviour;
use crate::blob::store::BlobStore;
use crate::client::{NetClient, NetEvent, COMMAND_CAPACITY, EVENT_CAPACITY};
use crate::config::{NetConfig, IDLE_CONNECTION_TIMEOUT};
use crate::counters::Counters;
use crate::error::NetError;
use crate::transport;

/// How long `start` waits for the listeners to come up.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(10);

/// A running node: talk to it through `client`, read `events`, stop it with `handle`.
pub struct Node {
    pub client: NetClient,
    /// The one event stream (bounded; see [`EVENT_CAPACITY`]).
    pub events: mpsc::Receiver<NetEvent>,
    pub handle: NodeHandle,
    /// Addresses the node listens on, each ending in `/p2p/<peer id>`.
    pub listen_addrs: Vec<Multiaddr>,
}

/// Stops the node. Dropping it stops the node too, without waiting.
pub struct NodeHandle {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl NodeHandle {
    /// Stops the swarm task and waits until it has closed its connections and ended.
    pub async fn shutdown(mut self) -> Result<(), NetError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.map_err(|e| NetError::Transport(format!("swarm task failed: {e}")))?;
        }
        Ok(())
    }
}

impl Node {
    /// Starts a node on the current tokio runtime.
    pub async fn start(cfg: NetConfig) -> Result<Node, NetError> {
        cfg.validate()?;
        let counters = Arc::new(Counters::default());
        let mut swarm = build_swarm(&cfg, counters.clone())?;
        let peer_id = *swarm.local_peer_id();
        let listen_addrs = listen(&mut swarm, &cfg.listen).await?;
        let with_p2p: Vec<Multiaddr> =
            listen_addrs.iter().map(|a| a.clone().with(Protocol::P2p(peer_id))).collect();
        for a in &with_p2p {
            info!(peer_id = %peer_id, addr = %a, "listening");
        }
        let topic = gossipsub::IdentTopic::new(topic_name(&cfg.run_name));
        swarm
            .behaviour_mut()
            .gossipsub
            .subscribe(&topic)
            .map_err(|e| NetError::Config(format!("gossipsub subscribe: {e}")))?;
        swarm
            .behaviour_mut()
            .gossipsub
            .subscribe(&members::members_topic(&cfg.run_name))
            .map_err(|e| NetError::Config(format!("gossipsub subscribe: {e}")))?;
        swarm
            .behaviour_mut()
            .gossipsub
            .subscribe(&heartbeats::topic(&cfg.run_name))
            .map_err(|e| NetError::Config(format!("gossipsub subscribe: {e}")))?;
        for addr in &cfg.bootstrap {
            dial_bootstrap(&mut swarm, addr);
        }

        let store = Arc::new(Mutex::new(BlobStore::new(cfg.store_budget)));
        let (cmd_tx, cmd_rx) = mpsc::channel(COMMAND_CAPACITY);
        let (ev_tx, ev_rx) = mpsc::channel(EVENT_CAPACITY);
        let (stop_tx, stop_rx) = oneshot::channel();
        let event_loop = event_loop::EventLoop::new(
            swarm,
            &cfg,
            topic,
            cmd_rx,
            ev_tx,
            stop_rx,
            store.clone(),
            counters,
        );
        let task = tokio::spawn(event_loop.run());
        Ok(Node {
            client: NetClient { peer_id, commands: cmd_tx, store, sources: Default::default() },
            events: ev_rx,
            handle: NodeHandle { stop: Some(stop_tx), task: Some(task) },
            listen_addrs: with_p2p,
        })
    }
}

fn build_swarm(cfg: &NetConfig, counters: Arc<Counters>) -> Result<Swarm<Behaviour>, NetError> {
    let (relay_transport, relay_client) =
        libp2p::relay::client::new(cfg.keypair.public().to_peer_id());
    let transport =
        transport::build(&cfg.keypair, cfg.swarm_key, counters.clone(), relay_transport)?;
    let behaviour = Behaviour::new(&cfg.keypair, cfg, counters, relay_client)?;
    Ok(SwarmBuilder::with_existing_identity(cfg.keypair.clone())
        .with_tokio()
        .with_other_transport(|_| transport)
        .map_err(|e| NetError::Transport(format!("{e:?}")))?
        .with_behaviour(|_| behaviour)
        .map_err(|e| NetError::Transport(format!("{e:?}")))?
        .with_swarm_config(|c| c.with_idle_connection_timeout(IDLE_CONNECTION_TIMEOUT))
        .build())
}

/// Starts every listener and waits until each reported an address (so that the caller can
/// print addresses others bootstrap from). Returns the addresses.
async fn listen(
    swarm: &mut Swarm<Behaviour>,
    addrs: &[Multiaddr],
) -> Result<Vec<Multiaddr>, NetError> {
    let mut waiting = HashSet::new();
    for addr in addrs {
        let id = swarm
            .listen_on(addr.clone())
            .map_err(|e| NetError::Listen { addr: addr.to_string(), reason: e.to_string() })?;
        waiting.insert(id);
    }
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + LISTEN_TIMEOUT;
    while !waiting.is_empty() {
        let event =
            tokio::time::timeout_at(deadline, swarm.select_next_some()).await.map_err(|_| {
                NetError::Listen {
                    addr: format!("{addrs:?}"),
                    reason: "no listen address reported in time".into(),
                }
            })?;
        match event {
            SwarmEvent::NewListenAddr { listener_id, address } => {
                waiting.remove(&listener_id);
                swarm.add_external_address(address.clone());
                out.push(address);
            }
            SwarmEvent::ListenerClosed { reason, addresses, .. } => {
                return Err(NetError::Listen {
                    addr: format!("{addresses:?}"),
                    reason: format!("{reason:?}"),
                })
            }
            SwarmEvent::ListenerError { error, .. } => {
                return Err(NetError::Listen {
                    addr: format!("{addrs:?}"),
                    reason: error.to_string(),
                })
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Dials a bootstrap address; with a `/p2p/` suffix the address also seeds the DHT.
pub(crate) fn dial_bootstrap(swarm: &mut Swarm<Behaviour>, addr: &Multiaddr) {
    if let Some((peer, plain)) = split_p2p(addr) {
        swarm.behaviour_mut().kad.add_address(&peer, plain);
    }
    if let Err(e) = swarm.dial(addr.clone()) {
        tracing::warn!(addr = %addr, error = %e, "cannot dial bootstrap peer");
    }
}

/// Splits `/…/p2p/<id>` into the peer id and the address without it.
pub fn split_p2p(addr: &Multiaddr) -> Option<(PeerId, Multiaddr)> {
    let mut plain = addr.clone();
    match plain.pop() {
        Some(Protocol::P2p(peer)) => Some((peer, plain)),
        _ => None,
    }
}
