//! The swarm task: the only owner of the libp2p `Swarm`.
//!
//! `select! { biased; stop, commands, queued uploads, discovery timer, block-list timer,
//! swarm events }`: local work first, so a flood from the network cannot starve the
//! program's commands. The block-list timer runs only with fault injection on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use libp2p::kad::{QueryId, RecordKey};
use libp2p::request_response::OutboundRequestId;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::{gossipsub, Multiaddr, PeerId, Swarm};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info};

use super::dials::DialQueue;
use super::hygiene::Hygiene;
use super::peers::PeerBook;
use super::uploads::UploadQueue;
use crate::announce;
use crate::behaviour::Behaviour;
use crate::blob::store::BlobStore;
use crate::blob::wire::BlobResponse;
use crate::client::{Command, NetEvent};
use crate::config::{run_key, NetConfig};
use crate::counters::Counters;
use crate::error::NetError;
use crate::fault::{self, BlockList};
use crate::swarmkey;

/// Outbound blob requests in flight at once (over all fetches).
pub const MAX_OUTBOUND_REQUESTS: usize = 1024;
/// How long shutdown waits for connections to close cleanly.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

pub(crate) struct EventLoop {
    pub(super) swarm: Swarm<Behaviour>,
    commands: mpsc::Receiver<Command>,
    commands_open: bool,
    events: mpsc::Sender<NetEvent>,
    stop: oneshot::Receiver<()>,
    pub(super) store: Arc<Mutex<BlobStore>>,
    pub(super) counters: Arc<Counters>,
    pub(super) run_name: String,
    run_key: RecordKey,
    pub(super) topic: gossipsub::IdentTopic,
    pub(super) bootstrap: Vec<Multiaddr>,
    discovery_interval: Duration,
    pub(super) started: Instant,
    /// Replies owed to clients for outbound blob requests.
    pub(super) pending: HashMap<OutboundRequestId, oneshot::Sender<Result<BlobResponse, NetError>>>,
    pub(super) uploads: UploadQueue,
    pub(super) peers: PeerBook,
    pub(super) events_dropped: u64,
    /// True once a provider record was stored on at least one peer since the last failure.
    pub(super) provided: bool,
    /// The running provider lookup and when it began.
    pub(super) providers_query: Option<(QueryId, Instant)>,
    /// When to re-provide, look up and refresh (see `discovery`).
    pub(super) schedule: super::discovery::Schedule,
    /// Fault injection: the peers we refuse, re-read from a file (`None` in normal runs).
    block_list: Option<BlockList>,
    /// Strikes, bans and the announcement rate limit.
    pub(super) hygiene: Hygiene,
    /// A private swarm (TCP only).
    pub(super) swarm_key: bool,
    /// The run's allow list (`None`: an open run).
    pub(super) allow: Option<std::collections::HashSet<PeerId>>,
    /// Dials started to providers of the run key.
    pub(super) provider_dials: u64,
    /// Providers waiting for a (bounded) dial.
    pub(super) dials: DialQueue,
    /// We listen on loopback, so loopback addresses of others may reach them.
    pub(super) on_loopback: bool,
    /// The run's member-records topic (see `members`).
    pub(super) members: gossipsub::IdentTopic,
    /// When our next member record is due (`None`: at the next tick).
    pub(super) record_due: Option<Instant>,
    /// Reachability, relay reservations, links (see `nat`).
    pub(super) nat: super::nat::NatState,
    /// The run's heartbeat topic (see `heartbeats`).
    pub(super) heartbeats: gossipsub::IdentTopic,
    /// The most recent failed dials (bounded), for the status file and joiners.
    pub(super) dial_failures: super::dial_failures::DialFailures,
}

impl EventLoop {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        swarm: Swarm<Behaviour>,
        cfg: &NetConfig,
        topic: gossipsub::IdentTopic,
        commands: mpsc::Receiver<Command>,
        events: mpsc::Sender<NetEvent>,
        stop: oneshot::Receiver<()>,
        store: Arc<Mutex<BlobStore>>,
        counters: Arc<Counters>,
    ) -> Self {
        let now = Instant::now();
        let mut event_loop = EventLoop {
            swarm,
            commands,
            commands_open: true,
            events,
            stop,
            store,
            counters,
            run_name: cfg.run_name.clone(),
            run_key: run_key(&cfg.run_name),
            topic,
            bootstrap: cfg.bootstrap.clone(),
            discovery_interval: cfg.discovery_interval,
            started: now,
            pending: HashMap::new(),
            uploads: UploadQueue::new(cfg, now),
            peers: PeerBook::default(),
            events_dropped: 0,
            provided: false,
            providers_query: None,
            schedule: super::discovery::Schedule::new(
                cfg.discovery_interval,
                crate::behaviour::PROVIDER_RECORD_TTL,
            ),
            block_list: cfg.block_list.clone().map(BlockList::new),
            hygiene: Hygiene::new(cfg.ban_file.clone()),
            swarm_key: cfg.swarm_key.is_some(),
            allow: cfg.allow.clone(),
            provider_dials: 0,
            dials: DialQueue::default(),
            on_loopback: cfg.listen.iter().any(crate::addr::is_loopback),
            members: super::members::members_topic(&cfg.run_name),
            record_due: None,
            nat: Default::default(),
            heartbeats: super::heartbeats::topic(&cfg.run_name),
            dial_failures: Default::default(),
        };
        event_loop.apply_loaded_bans();
        event_loop
    }

    pub(crate) async fn run(mut self) {
        let mut discovery = tokio::time::interval(self.discovery_interval);
        discovery.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut block_poll = tokio::time::interval(fault::POLL_INTERVAL);
        block_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next_upload = self.uploads.next_at();
            let upload_sleep = tokio::time::sleep_until(
                next_upload.map_or_else(tokio::time::Instant::now, tokio::time::Instant::from_std),
            );
            tokio::select! {
                biased;
                _ = &mut self.stop => break,
                cmd = self.commands.recv(), if self.commands_open => match cmd {
                    Some(cmd) => self.on_command(cmd),
                    // All clients dropped: keep serving the swarm until told to stop.
                    None => self.commands_open = false,
                },
                _ = upload_sleep, if next_upload.is_some() => self.flush_uploads(),
                _ = discovery.tick() => self.discover(),
                _ = block_poll.tick(), if self.block_list.is_some() => self.poll_block_list(),
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
            }
        }
        self.close().await;
    }

    /// Disconnects everyone and drives the swarm until the connections are closed (so that
    /// peers learn at once, QUIC included) or the grace period ends.
    async fn close(&mut self) {
        info!("shutting down");
        self.pending.clear();
        let connected: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
        for p in connected {
            let _ = self.swarm.disconnect_peer_id(p);
        }
        let deadline = tokio::time::Instant::now() + CLOSE_GRACE;
        while self.swarm.network_info().num_peers() > 0 {
            match tokio::time::timeout_at(deadline, self.swarm.select_next_some()).await {
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }

    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Publish { payload, reply } => {
                let _ = reply.send(self.publish(&payload));
            }
            Command::BlobRequest { peer, request, reply } => {
                if self.peers.is_penalised(&peer, Instant::now()) {
                    let _ = reply.send(Err(NetError::Penalised(peer.to_string())));
                } else if self.pending.len() >= MAX_OUTBOUND_REQUESTS {
                    let _ = reply.send(Err(NetError::TooManyRequests(MAX_OUTBOUND_REQUESTS)));
                } else {
                    let id = self.swarm.behaviour_mut().blob.send_request(&peer, request);
                    self.pending.insert(id, reply);
                }
            }
            Command::Dial { addr, reply } if self.swarm_key && swarmkey::is_quic(&addr) => {
                let _ = reply.send(Err(swarmkey::quic_refused(&addr, false)));
            }
            Command::Dial { addr, reply } => {
                let res = self
                    .swarm
                    .dial(addr.clone())
                    .map_err(|e| NetError::Dial { addr: addr.to_string(), reason: e.to_string() });
                let _ = reply.send(res);
            }
            Command::Report { peer, reason } => {
                self.peers.reject(peer.to_string(), reason, "reported by fetch");
                if reason.is_penalty() {
                    self.peers.penalise(peer, Instant::now());
                    self.emit(NetEvent::PeerPenalised { peer, reason });
                    self.strike(peer, reason.as_str(), 1.0);
                }
            }
            Command::Penalize { peer, reason } => self.strike(peer, reason, 1.0),
            Command::Banned { reply } => {
                let _ = reply.send(self.banned_peers());
            }
            Command::Stats { reply } => {
                let _ = reply.send(self.stats());
            }
            Command::RunPeers { reply } => {
                let _ = reply.send(self.run_peers());
            }
            Command::Heartbeat { payload, reply } => {
                let _ = reply.send(self.publish_heartbeat(payload));
            }
        }
    }

    fn publish(&mut self, payload: &[u8]) -> Result<(), NetError> {
        let data = announce::encode(payload)?;
        let len = data.len() as u64;
        self.swarm
            .behaviour_mut()
            .gossipsub
            .publish(self.topic.clone(), data)
            .map_err(|e| NetError::Publish(e.to_string()))?;
        self.counters.announce.add_out(len);
        Ok(())
    }

    /// Sends an event to the program; drops it (counted) if the program is behind.
    pub(super) fn emit(&mut self, event: NetEvent) {
        if self.events.try_send(event).is_err() {
            self.events_dropped += 1;
        }
    }

    fn flush_uploads(&mut self) {
        let now = Instant::now();
        while let Some(p) = self.uploads.pop_ready(now) {
            let _ = self.swarm.behaviour_mut().blob.send_response(p.channel, p.response);
        }
    }

    /// One discovery tick: re-provide, look up run peers, refresh the routing table, and
    /// re-dial the bootstrap peers if we have lost every peer.
    pub(super) fn discover(&mut self) {
        let due = self.schedule.next(self.peers.members.len(), self.provided);
        self.dials.tick();
        self.publish_record(Instant::now());
        self.dial_providers();
        self.ensure_reservations();
        let table = self.routing_table_size();
        if table == 0 {
            if self.schedule.tick() > 1 && self.swarm.network_info().num_peers() == 0 {
                for addr in self.bootstrap.clone() {
                    super::dial_bootstrap(&mut self.swarm, &addr);
                }
            }
            return;
        }
        let kad = &mut self.swarm.behaviour_mut().kad;
        if due.provide {
            if let Err(e) = kad.start_providing(self.run_key.clone()) {
                debug!(error = %e, "cannot store own provider record");
            }
            // Assume success until the query says otherwise, so we do not re-provide on
            // every tick while the first one runs.
            self.provided = true;
        }
        let stale =
            self.providers_query.is_some_and(|(_, t)| t.elapsed() > 3 * self.discovery_interval);
        if stale {
            if let Some((id, _)) = self.providers_query.take() {
                if let Some(mut q) = kad.query_mut(&id) {
                    q.finish();
                }
                self.schedule.lookup_ended();
            }
        }
        let kad = &mut self.swarm.behaviour_mut().kad;
        if self.providers_query.is_none() && due.lookup {
            let id = kad.get_providers(self.run_key.clone());
            self.providers_query = Some((id, Instant::now()));
            self.schedule.lookup_started();
        }
        if due.bootstrap {
            let _ = kad.bootstrap();
        }
    }

    /// Fault injection: applies changes of the block-list file. Blocking closes the
    /// peer's connections (`allow_block_list` does) and refuses new ones both ways;
    /// unblocking only lifts the refusal: reconnecting is left to discovery, as after a
    /// real partition. The file is tiny and local, so it is read on this task.
    fn poll_block_list(&mut self) {
        let Some(change) = self.block_list.as_mut().and_then(BlockList::poll) else {
            return;
        };
        let blocked = self.block_list.as_ref().map_or(0, BlockList::len);
        for p in &change.block {
            self.fault_block(*p);
        }
        for p in &change.unblock {
            self.fault_unblock(*p);
        }
        info!(
            blocked,
            newly_blocked = change.block.len(),
            unblocked = change.unblock.len(),
            "fault injection: block list changed"
        );
    }

    /// A peer is in our run: note it, and dial it or announce it as joined.
    pub(super) fn learn_run_peer(&mut self, peer: PeerId) {
        if peer == *self.swarm.local_peer_id() || self.hygiene.is_banned(&peer) {
            return;
        }
        self.peers.learn_run_peer(peer);
        if self.swarm.is_connected(&peer) {
            self.member_connected(peer);
        } else if !self.peers.is_penalised(&peer, Instant::now())
            && self.peers.may_dial(&peer, Instant::now())
        {
            let opts =
                DialOpts::peer_id(peer).condition(PeerCondition::DisconnectedAndNotDialing).build();
            if let Err(e) = self.swarm.dial(opts) {
                debug!(peer = %peer, error = %e, "cannot dial run peer");
            }
        }
    }

    pub(super) fn member_connected(&mut self, peer: PeerId) {
        if self.peers.known_run.contains(&peer) && self.peers.members.insert(peer) {
            // Throttled: a peer that keeps reconnecting is one line a minute.
            if self.peers.may_log(peer.to_string(), "joined") {
                info!(peer = %peer, "run peer connected");
            }
            self.emit(NetEvent::RunPeerJoined(peer));
            self.record_soon(Instant::now());
        }
    }

    pub(super) fn member_disconnected(&mut self, peer: PeerId) {
        if self.peers.members.remove(&peer) {
            self.schedule.lost();
            if self.peers.may_log(peer.to_string(), "left") {
                info!(peer = %peer, "run peer disconnected");
            }
            self.emit(NetEvent::RunPeerLeft(peer));
        }
    }

    pub(super) fn run_peers(&self) -> Vec<PeerId> {
        let mut v: Vec<PeerId> = self.peers.members.iter().copied().collect();
        v.sort();
        v
    }

    pub(super) fn routing_table_size(&mut self) -> usize {
        self.swarm.behaviour_mut().kad.kbuckets().map(|b| b.num_entries()).sum()
    }

    pub(super) fn payload(data: &[u8]) -> Bytes {
        Bytes::copy_from_slice(data)
    }
}
