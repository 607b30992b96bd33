//! NAT traversal in the swarm task: reachability from AutoNAT, relay reservations while
//! private, hole punching outcomes, and which link each peer is on (see [`crate::nat`]).
//!
//! Prefer direct: when a direct connection to a peer exists (dialled, accepted, or made by
//! hole punching), its relayed connections are closed, so blob transfers and gossip run
//! over the direct link and a relay only carries the pairs no punch could connect.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::BuildHasher;

use libp2p::core::transport::ListenerId;
use libp2p::core::ConnectedPoint;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::ConnectionId;
use libp2p::{autonat, dcutr, identify, relay, Multiaddr, PeerId};
use tracing::{debug, info, warn};

use super::event_loop::EventLoop;
use crate::counters::{LinkKind, PeerLink, Reachability, RelayStats};
use crate::nat::{MAX_PUNCH_RETRIES, MAX_RELAY_CANDIDATES, MAX_RESERVATIONS};

/// Peers whose hole-punch retries are remembered.
const MAX_PUNCH_PEERS: usize = 1024;

/// The swarm task's NAT state. Everything is bounded: connections by the connection
/// limits, candidates by [`MAX_RELAY_CANDIDATES`], listeners by [`MAX_RESERVATIONS`].
#[derive(Default)]
pub(super) struct NatState {
    pub(super) reachability: Reachability,
    /// Every established connection: its peer, remote address and whether it is relayed.
    conns: HashMap<ConnectionId, Conn>,
    /// Connected peers that serve circuit relay v2, with an address that reaches them.
    candidates: BTreeMap<PeerId, Multiaddr>,
    /// Orders relay candidates by a hash keyed at random in each process: a relay cannot
    /// grind an id that every peer, or one victim, prefers (lowest ids did before).
    rank: std::hash::RandomState,
    /// Our circuit listeners (one per relay asked for a reservation).
    listeners: HashMap<ListenerId, PeerId>,
    /// Relays that accepted our reservation.
    reserved: BTreeSet<PeerId>,
    /// Relay server figures (when serving).
    reservations_served: BTreeSet<PeerId>,
    circuits_served: u64,
    holepunch_ok: u64,
    holepunch_failed: u64,
    /// Hole punches retried per peer (bounded: cleared when full).
    punch_retries: HashMap<PeerId, u32>,
}

/// One established connection.
struct Conn {
    peer: PeerId,
    addr: Multiaddr,
    /// Through a relay. Not read off `addr`: an accepted circuit's remote address is just
    /// `/p2p/<peer>`; libp2p marks the endpoint instead.
    relayed: bool,
}

/// True when the address goes through a relay.
pub(crate) fn is_relayed(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| matches!(p, Protocol::P2pCircuit))
}

impl EventLoop {
    pub(super) fn nat_connection_established(
        &mut self,
        peer: PeerId,
        id: ConnectionId,
        endpoint: &ConnectedPoint,
    ) {
        let addr = endpoint.get_remote_address().clone();
        let relayed = endpoint.is_relayed();
        if !relayed && endpoint.is_dialer() && self.nat.candidates.contains_key(&peer) {
            // Remember how we reached this relay.
            self.nat.candidates.insert(peer, addr.clone());
        }
        self.nat.conns.insert(id, Conn { peer, addr, relayed });
        if !relayed {
            self.close_relayed(peer);
        } else if self.has_direct(&peer) {
            // Already direct: the new circuit is redundant.
            self.swarm.close_connection(id);
        }
    }

    pub(super) fn nat_connection_closed(&mut self, id: ConnectionId) {
        self.nat.conns.remove(&id);
    }

    fn has_direct(&self, peer: &PeerId) -> bool {
        self.nat.conns.values().any(|c| c.peer == *peer && !c.relayed)
    }

    /// Closes every relayed connection to `peer` (it has a direct one).
    fn close_relayed(&mut self, peer: PeerId) {
        let relayed: Vec<ConnectionId> = self
            .nat
            .conns
            .iter()
            .filter(|(_, c)| c.peer == peer && c.relayed)
            .map(|(id, _)| *id)
            .collect();
        for id in relayed {
            debug!(peer = %peer, "direct connection up: closing the relayed one");
            self.swarm.close_connection(id);
        }
    }

    /// Identify told us what `peer` serves: a relay becomes a reservation candidate.
    pub(super) fn nat_identified(&mut self, peer: PeerId, info: &identify::Info) {
        if !info.protocols.contains(&relay::HOP_PROTOCOL_NAME) {
            self.nat.candidates.remove(&peer);
            return;
        }
        // An address that reaches it: the one we dialled, else one it listens on.
        let dialled = self.nat.conns.values().find(|c| c.peer == peer && !c.relayed);
        let addr = dialled.map(|c| c.addr.clone()).or_else(|| {
            let same_host = crate::addr::is_loopback(&info.observed_addr);
            info.listen_addrs
                .iter()
                .find(|a| !is_relayed(a) && (same_host || !crate::addr::is_loopback(a)))
                .cloned()
        });
        let Some(addr) = addr else { return };
        let nat = &mut self.nat;
        if admit_candidate(&mut nat.candidates, &nat.reserved, &nat.rank, peer, addr) {
            self.ensure_reservations();
        }
    }

    pub(super) fn on_autonat(&mut self, event: autonat::Event) {
        let autonat::Event::StatusChanged { new, .. } = event else { return };
        let reachability = match new {
            autonat::NatStatus::Public(addr) => {
                info!(addr = %addr, "reachable from the swarm (AutoNAT): public");
                Reachability::Public
            }
            autonat::NatStatus::Private => {
                info!("not reachable from the swarm (AutoNAT): private; using relays");
                Reachability::Private
            }
            autonat::NatStatus::Unknown => Reachability::Unknown,
        };
        self.nat.reachability = reachability;
        self.ensure_reservations();
    }

    /// While private, holds reservations on up to [`MAX_RESERVATIONS`] relays. Called when
    /// reachability changes, a relay is found, a reservation ends, and on every tick.
    pub(super) fn ensure_reservations(&mut self) {
        if self.nat.reachability != Reachability::Private {
            return;
        }
        let asked: BTreeSet<PeerId> = self.nat.listeners.values().copied().collect();
        let mut fresh: Vec<(PeerId, Multiaddr)> = self
            .nat
            .candidates
            .iter()
            .filter(|(p, _)| !asked.contains(p) && self.swarm.is_connected(p))
            .map(|(p, a)| (*p, a.clone()))
            .collect();
        fresh.sort_by_key(|(p, _)| self.nat.rank.hash_one(p));
        fresh.truncate(MAX_RESERVATIONS.saturating_sub(asked.len()));
        for (relay, addr) in fresh {
            let mut circuit = addr;
            if matches!(circuit.iter().last(), Some(Protocol::P2p(_))) {
                circuit.pop();
            }
            let circuit = circuit.with(Protocol::P2p(relay)).with(Protocol::P2pCircuit);
            match self.swarm.listen_on(circuit.clone()) {
                Ok(id) => {
                    debug!(relay = %relay, addr = %circuit, "asking for a relay reservation");
                    self.nat.listeners.insert(id, relay);
                }
                Err(e) => {
                    warn!(relay = %relay, addr = %circuit, error = ?e, "cannot listen through relay");
                    self.nat.candidates.remove(&relay);
                }
            }
        }
    }

    /// A listener closed: if it was a circuit, its reservation is gone.
    pub(super) fn nat_listener_closed(&mut self, id: ListenerId) {
        if let Some(relay) = self.nat.listeners.remove(&id) {
            if self.nat.reserved.remove(&relay) {
                info!(relay = %relay, "relay reservation ended");
            }
        }
    }

    pub(super) fn on_relay_client(&mut self, event: relay::client::Event) {
        if let relay::client::Event::ReservationReqAccepted { relay_peer_id, renewal, .. } = event {
            if self.nat.reserved.insert(relay_peer_id) && !renewal {
                info!(relay = %relay_peer_id, "relay reservation accepted: reachable through it");
            }
        }
    }

    pub(super) fn on_relay_server(&mut self, event: relay::Event) {
        match event {
            // Bounded by the relay's own `max_reservations`: only accepted ones are here.
            relay::Event::ReservationReqAccepted { src_peer_id, .. } => {
                self.nat.reservations_served.insert(src_peer_id);
            }
            relay::Event::ReservationClosed { src_peer_id }
            | relay::Event::ReservationTimedOut { src_peer_id } => {
                self.nat.reservations_served.remove(&src_peer_id);
            }
            relay::Event::CircuitReqAccepted { src_peer_id, dst_peer_id } => {
                debug!(src = %src_peer_id, dst = %dst_peer_id, "relaying a circuit");
                self.nat.circuits_served += 1;
            }
            _ => {}
        }
    }

    pub(super) fn on_dcutr(&mut self, event: dcutr::Event) {
        match event.result {
            Ok(_) => {
                self.nat.holepunch_ok += 1;
                info!(peer = %event.remote_peer_id, "hole punching succeeded: direct connection");
            }
            Err(e) => {
                self.nat.holepunch_failed += 1;
                let peer = event.remote_peer_id;
                if self.peers.may_log(peer.to_string(), "holepunch") {
                    info!(peer = %peer, error = %e, "hole punching failed: staying on the relay");
                }
                // A punch is a race of two simultaneous dials and can fail on timing alone:
                // drop the circuit a few times, so that the next one (discovery re-dials the
                // member through the relay) runs DCUtR again.
                if self.nat.punch_retries.len() >= MAX_PUNCH_PEERS {
                    self.nat.punch_retries.clear();
                }
                let direct = self.has_direct(&peer);
                let tries = self.nat.punch_retries.entry(peer).or_insert(0);
                if *tries < MAX_PUNCH_RETRIES && !direct {
                    *tries += 1;
                    self.close_relayed(peer);
                }
            }
        }
    }

    /// The link to each connected run peer: direct if any connection is.
    pub(super) fn nat_links(&self) -> Vec<PeerLink> {
        let mut out = Vec::new();
        for peer in self.run_peers() {
            let mine = self.nat.conns.values().filter(|c| c.peer == peer);
            if let Some(c) = mine.min_by_key(|c| c.relayed) {
                let kind = if c.relayed { LinkKind::Relayed } else { LinkKind::Direct };
                out.push(PeerLink { peer: peer.to_string(), kind, addr: c.addr.to_string() });
            }
        }
        out
    }

    pub(super) fn nat_relay_stats(&self) -> RelayStats {
        RelayStats {
            serving: self.swarm.behaviour().relay.is_enabled(),
            reservations_served: self.nat.reservations_served.len(),
            circuits_served: self.nat.circuits_served,
            circuit_bytes: self.counters.relayed.get(),
            reservations: self.nat.reserved.iter().map(|p| p.to_string()).collect(),
            holepunch_ok: self.nat.holepunch_ok,
            holepunch_failed: self.nat.holepunch_failed,
        }
    }
}

/// Adds relay `peer` to `candidates`, bounded by [`MAX_RELAY_CANDIDATES`]: when full, it
/// replaces the worst-ranked candidate that holds no reservation of ours, if it ranks
/// better, so the first relays to connect cannot hold every slot. Returns whether it was
/// added (or its address updated).
fn admit_candidate(
    candidates: &mut BTreeMap<PeerId, Multiaddr>,
    reserved: &BTreeSet<PeerId>,
    rank: &std::hash::RandomState,
    peer: PeerId,
    addr: Multiaddr,
) -> bool {
    if candidates.len() >= MAX_RELAY_CANDIDATES && !candidates.contains_key(&peer) {
        let worst = candidates
            .keys()
            .filter(|p| !reserved.contains(p))
            .copied()
            .max_by_key(|p| rank.hash_one(p));
        match worst {
            Some(w) if rank.hash_one(peer) < rank.hash_one(w) => candidates.remove(&w),
            _ => return false,
        };
    }
    candidates.insert(peer, addr);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn circuit_addresses_are_relayed() {
        let relay = PeerId::random();
        let direct: Multiaddr = "/ip4/10.0.0.1/tcp/4001".parse().unwrap();
        let circuit = direct.clone().with(Protocol::P2p(relay)).with(Protocol::P2pCircuit);
        assert!(!is_relayed(&direct));
        assert!(is_relayed(&circuit));
    }

    /// However many relays connect, and in whatever order, the candidates kept are the
    /// best-ranked by this process's random key (not the lowest ids, which can be ground),
    /// and a relay holding our reservation is never displaced.
    #[test]
    fn relay_candidates_are_the_best_ranked_not_the_first_or_lowest() {
        let rank = std::hash::RandomState::new();
        let addr: Multiaddr = "/ip4/10.0.0.1/tcp/1".parse().unwrap();
        let mut candidates = BTreeMap::new();
        let reserved_one = PeerId::random();
        let reserved = BTreeSet::from([reserved_one]);
        assert!(admit_candidate(&mut candidates, &reserved, &rank, reserved_one, addr.clone()));
        let others: Vec<PeerId> = (0..200).map(|_| PeerId::random()).collect();
        for p in &others {
            admit_candidate(&mut candidates, &reserved, &rank, *p, addr.clone());
        }
        let mut best = others.clone();
        best.sort_by_key(|p| rank.hash_one(p));
        best.truncate(MAX_RELAY_CANDIDATES - 1);
        best.push(reserved_one);
        best.sort();
        assert_eq!(candidates.keys().copied().collect::<Vec<_>>(), best);
    }
}
