//! How the swarm task reacts to what the network does.

use std::time::Instant;

use libp2p::kad::{self, GetProvidersOk, QueryResult};
use libp2p::multiaddr::Protocol;
use libp2p::request_response::{self, Message};
use libp2p::swarm::{ConnectionId, DialError, ListenError, SwarmEvent};
use libp2p::{allow_block_list, gossipsub, identify, mdns, ping, Multiaddr, PeerId};
use tracing::{debug, info};

use super::event_loop::EventLoop;
use crate::announce;
use crate::behaviour::{BehaviourEvent, IDENTIFY_PROTOCOL_VERSION, KAD_PROTOCOL};
use crate::blob::wire::{BlobRequest, BlobResponse};
use crate::client::NetEvent;
use crate::counters::RejectReason;
use crate::error::{AnnounceError, NetError};
use crate::iplimit::IpLimitExceeded;

/// Added to handshake failures in a private swarm, where they usually mean a key mismatch.
const SWARM_KEY_HINT: &str =
    " (private swarm: the peer may have another swarm key, or none; pnet cannot tell)";

/// Added to transport failures when we have no swarm key: a private swarm looks like a
/// peer that never completes the handshake.
const NO_KEY_HINT: &str = " (if the peer's swarm is private, start with its --swarm-key)";

impl EventLoop {
    pub(super) fn on_swarm_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        match &event {
            SwarmEvent::ConnectionEstablished { peer_id, connection_id, endpoint, .. } => {
                self.nat_connection_established(*peer_id, *connection_id, endpoint)
            }
            SwarmEvent::ConnectionClosed { connection_id, .. } => {
                self.nat_connection_closed(*connection_id)
            }
            SwarmEvent::ListenerClosed { listener_id, .. } => {
                self.nat_listener_closed(*listener_id)
            }
            _ => {}
        }
        match event {
            SwarmEvent::Behaviour(ev) => self.on_behaviour_event(ev),
            SwarmEvent::ConnectionEstablished { peer_id, .. }
                if self.allow.as_ref().is_some_and(|a| !a.contains(&peer_id)) =>
            {
                let _ = self.swarm.disconnect_peer_id(peer_id);
                let why = "not on the run's allow list: disconnected";
                self.peers.reject(peer_id.to_string(), RejectReason::NotAllowed, why);
            }
            SwarmEvent::ConnectionEstablished { peer_id, num_established, .. }
                if num_established.get() == 1 =>
            {
                self.peers.connected(&peer_id);
                self.dials.done(&peer_id);
                self.member_connected(peer_id)
            }
            SwarmEvent::ConnectionClosed { peer_id, num_established: 0, .. } => {
                self.member_disconnected(peer_id)
            }
            // A banned peer, or our own fault injection: already counted, nothing to add.
            SwarmEvent::IncomingConnectionError {
                error: ListenError::Denied { cause }, ..
            } if cause.downcast_ref::<allow_block_list::Blocked>().is_some() => {}
            SwarmEvent::IncomingConnectionError {
                send_back_addr,
                error: ListenError::Denied { cause },
                ..
            } if cause.downcast_ref::<IpLimitExceeded>().is_some() => {
                let who = remote_ip(&send_back_addr);
                self.peers.reject(who, RejectReason::IpLimit, &cause.to_string());
            }
            SwarmEvent::IncomingConnectionError { send_back_addr, error, .. } => {
                let who = remote_ip(&send_back_addr);
                let mut detail = error.to_string();
                if self.swarm_key {
                    detail.push_str(SWARM_KEY_HINT);
                }
                self.peers.reject(who, RejectReason::Handshake, &detail);
            }
            SwarmEvent::NewListenAddr { address, .. } => {
                self.swarm.add_external_address(address);
            }
            SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                self.dial_failures.record(peer_id, &error, self.started.elapsed().as_secs());
                let who = peer_id.map_or_else(|| "unknown peer".to_string(), |p| p.to_string());
                // A transport failure is what a person needs to see (a bootstrap address that
                // is wrong, unreachable, or a private swarm); once per peer per window.
                if matches!(error, DialError::Transport(_))
                    && self.peers.may_log(who, "dial_failed")
                {
                    let hint = if self.swarm_key { SWARM_KEY_HINT } else { NO_KEY_HINT };
                    info!(peer = ?peer_id, error = %error, "dial failed{hint}");
                } else {
                    debug!(peer = ?peer_id, error = %error, "dial failed");
                }
                // Back off only from peers that were tried and did not answer; a peer whose
                // address is not known yet may be learnt by the next provider lookup.
                if let Some(p) = &peer_id {
                    self.dials.done(p);
                }
                let tried =
                    matches!(error, DialError::Transport(_) | DialError::WrongPeerId { .. });
                if let Some(p) = peer_id.filter(|p| tried && !self.swarm.is_connected(p)) {
                    self.peers.dial_failed(p, Instant::now());
                }
            }
            _ => {}
        }
    }

    fn on_behaviour_event(&mut self, event: BehaviourEvent) {
        match event {
            BehaviourEvent::Identify(identify::Event::Received { peer_id, info, .. }) => {
                self.on_identify(peer_id, info)
            }
            BehaviourEvent::Kad(ev) => self.on_kad(ev),
            BehaviourEvent::Ping(ping::Event { peer, connection, result: Err(e) }) => {
                self.on_ping_failure(peer, connection, e)
            }
            BehaviourEvent::Gossipsub(ev) => self.on_gossip(ev),
            BehaviourEvent::Blob(ev) => self.on_blob(ev),
            BehaviourEvent::Autonat(ev) => self.on_autonat(ev),
            BehaviourEvent::RelayClient(ev) => self.on_relay_client(ev),
            BehaviourEvent::Relay(ev) => self.on_relay_server(ev),
            BehaviourEvent::Dcutr(ev) => self.on_dcutr(ev),
            BehaviourEvent::Mdns(mdns::Event::Discovered(list)) => {
                for (peer, addr) in list {
                    self.swarm.behaviour_mut().kad.add_address(&peer, addr);
                    self.learn_candidate(peer);
                }
            }
            _ => {}
        }
    }

    /// Kademlia does not learn the addresses of peers that dialled us; identify tells us
    /// their listen addresses, and we feed them into the routing table.
    fn on_identify(&mut self, peer: PeerId, info: identify::Info) {
        if info.protocol_version != IDENTIFY_PROTOCOL_VERSION {
            self.peers.reject(peer.to_string(), RejectReason::PeerVersion, &info.protocol_version);
            return;
        }
        self.nat_identified(peer, &info);
        let manifest = crate::advert::manifest_of(&info.agent_version);
        self.emit(NetEvent::PeerIdentified { peer, manifest });
        if !info.protocols.contains(&KAD_PROTOCOL) {
            return;
        }
        // The peer saw us at a loopback address: we share a host, and its loopback
        // addresses reach it. Otherwise they would reach some other process of ours.
        let same_host = crate::addr::is_loopback(&info.observed_addr);
        for addr in info.listen_addrs {
            if crate::addr::is_loopback(&addr) && !same_host {
                continue;
            }
            self.swarm.behaviour_mut().kad.add_address(&peer, addr);
        }
    }

    /// Two pings in a row went unanswered: the connection is dead or silent (a partition
    /// that drops packets leaves TCP open for many minutes). Close it, so that the peer
    /// leaves the run peers, fetches stop waiting on it and discovery re-dials it once it
    /// can be reached again. A peer that does not speak ping is left alone.
    fn on_ping_failure(&mut self, peer: PeerId, connection: ConnectionId, e: ping::Failure) {
        if matches!(e, ping::Failure::Unsupported) {
            return;
        }
        if self.peers.may_log(peer.to_string(), "unresponsive") {
            info!(peer = %peer, error = %e, "connection unresponsive; closing it");
        }
        self.swarm.close_connection(connection);
    }

    /// A peer found on the LAN: connect; whether it is in our run is learnt from its
    /// provider record or topic subscription.
    fn learn_candidate(&mut self, peer: PeerId) {
        if !self.swarm.is_connected(&peer) {
            let _ = self.swarm.dial(peer);
        }
    }

    fn on_kad(&mut self, event: kad::Event) {
        match event {
            kad::Event::OutboundQueryProgressed { id, result, step, .. } => match result {
                QueryResult::GetProviders(res) => {
                    if let Ok(GetProvidersOk::FoundProviders { providers, .. }) = res {
                        for p in providers {
                            if p == *self.swarm.local_peer_id() {
                                continue;
                            }
                            if !self.peers.known_run.contains(&p) {
                                self.schedule.found_new();
                            }
                            // One this peer would dial (not banned, allowed in the run).
                            let dialable = !self.hygiene.is_banned(&p)
                                && self.allow.as_ref().is_none_or(|a| a.contains(&p));
                            if dialable && !self.swarm.is_connected(&p) {
                                self.schedule.saw_unconnected();
                            }
                            self.learn_provider(p);
                        }
                    }
                    if step.last {
                        self.end_providers_query(id);
                    }
                }
                QueryResult::StartProviding(Err(e)) => {
                    debug!(error = %e, "providing the run key failed; retrying next tick");
                    self.provided = false;
                }
                _ => {}
            },
            // The first peer in the table: announce ourselves and look around now rather
            // than at the next tick.
            kad::Event::RoutingUpdated { is_new_peer: true, .. } if !self.provided => {
                self.discover()
            }
            _ => {}
        }
    }

    fn end_providers_query(&mut self, id: kad::QueryId) {
        if self.providers_query.is_some_and(|(q, _)| q == id) {
            self.providers_query = None;
            self.schedule.lookup_ended();
        }
    }

    fn on_gossip(&mut self, event: gossipsub::Event) {
        match event {
            gossipsub::Event::Message { propagation_source, message_id, message } => {
                // A flood must not push honest events out of the bounded event channel: over
                // its forwarder's token bucket, or its signed author's however many
                // forwarders carry it, a message is ignored (not penalised: an honest
                // forwarder may burst) and counted.
                let now = Instant::now();
                let over = if !self.hygiene.admit_announcement(propagation_source, now) {
                    Some((propagation_source.to_string(), "gossip over the per-source rate limit"))
                } else if !self.hygiene.admit_author(message.source, now) {
                    let author = message.source.map(|a| a.to_string()).unwrap_or_default();
                    Some((author, "gossip over the per-author rate limit"))
                } else {
                    None
                };
                if let Some((who, detail)) = over {
                    self.peers.reject(who, RejectReason::RateLimited, detail);
                    self.swarm.behaviour_mut().gossipsub.report_message_validation_result(
                        &message_id,
                        &propagation_source,
                        gossipsub::MessageAcceptance::Ignore,
                    );
                    return;
                }
                if message.topic == self.heartbeats.hash() {
                    let verdict =
                        self.on_heartbeat(propagation_source, message.source, &message.data);
                    self.swarm.behaviour_mut().gossipsub.report_message_validation_result(
                        &message_id,
                        &propagation_source,
                        verdict,
                    );
                    return;
                }
                if message.topic == self.members.hash() {
                    let verdict = self.on_record(propagation_source, message.source, &message.data);
                    self.swarm.behaviour_mut().gossipsub.report_message_validation_result(
                        &message_id,
                        &propagation_source,
                        verdict,
                    );
                    return;
                }
                let verdict = if message.topic != self.topic.hash() {
                    Err(AnnounceError::WrongRun {
                        got: message.topic.to_string(),
                        expected: self.run_name.clone(),
                    })
                } else {
                    announce::decode(&message.data).map(EventLoop::payload)
                };
                let acceptance = match verdict {
                    Ok(payload) => {
                        let n = message.data.len() as u64;
                        self.counters.announce.add_in(n);
                        self.peers.add_bytes(propagation_source, 0, n);
                        self.emit(NetEvent::Announcement {
                            from: propagation_source,
                            author: message.source,
                            payload,
                        });
                        gossipsub::MessageAcceptance::Accept
                    }
                    Err(e) => {
                        let reason = match e {
                            AnnounceError::Oversized { .. } => RejectReason::Oversized,
                            AnnounceError::WrongRun { .. } => RejectReason::WrongRun,
                            AnnounceError::WrongVersion { .. } => RejectReason::WrongVersion,
                            _ => RejectReason::Malformed,
                        };
                        self.peers.reject(propagation_source.to_string(), reason, &e.to_string());
                        // Honest peers validate before forwarding: the source is to blame.
                        self.strike(propagation_source, reason.as_str(), strike_weight(reason));
                        gossipsub::MessageAcceptance::Reject
                    }
                };
                self.swarm.behaviour_mut().gossipsub.report_message_validation_result(
                    &message_id,
                    &propagation_source,
                    acceptance,
                );
            }
            gossipsub::Event::Subscribed { peer_id, topic } if topic == self.topic.hash() => {
                self.learn_run_peer(peer_id);
            }
            _ => {}
        }
    }

    fn on_blob(&mut self, event: request_response::Event<BlobRequest, BlobResponse>) {
        match event {
            request_response::Event::Message { peer, message, .. } => match message {
                Message::Request { request, channel, .. } => self.serve(peer, request, channel),
                Message::Response { request_id, response } => {
                    self.peers.add_bytes(peer, 0, response.payload_len() as u64);
                    if let Some(reply) = self.pending.remove(&request_id) {
                        let _ = reply.send(Ok(response));
                    }
                }
            },
            request_response::Event::OutboundFailure { peer, request_id, error, .. } => {
                if let Some(reply) = self.pending.remove(&request_id) {
                    let _ = reply.send(Err(NetError::Request {
                        peer: peer.to_string(),
                        reason: error.to_string(),
                    }));
                }
            }
            // Read failures are counted in the codec; what is left here is a requester
            // that went away or timed out before our answer.
            request_response::Event::InboundFailure { peer, error, .. } => {
                debug!(peer = %peer, error = %error, "inbound blob request failed")
            }
            request_response::Event::ResponseSent { .. } => {}
        }
    }
}

/// Strikes for an announcement net rejected. Bytes that are not an envelope, or too many
/// of them, are never sent by an honest peer: two such messages ban (gossipsub graylists a
/// sender after three invalid messages, so a ban must come before). Another run or
/// version may be an honest peer on the wrong build: one strike each, so it is graylisted
/// within three messages but banned only if it keeps at it after its score recovered.
fn strike_weight(reason: RejectReason) -> f64 {
    match reason {
        RejectReason::Malformed | RejectReason::Oversized => 4.0,
        _ => 1.0,
    }
}

/// The IP part of a remote address (what "once per peer" means before a handshake).
fn remote_ip(addr: &Multiaddr) -> String {
    addr.iter()
        .find_map(|p| match p {
            Protocol::Ip4(ip) => Some(ip.to_string()),
            Protocol::Ip6(ip) => Some(ip.to_string()),
            _ => None,
        })
        .unwrap_or_else(|| addr.to_string())
}
