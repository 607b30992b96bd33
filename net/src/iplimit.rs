//! Connection caps per remote IP: one host cannot fill our connection slots.
//!
//! `connection_limits` caps connections per peer id and in all, but peer ids are free: a
//! host that opens hundreds of connections under fresh ids (or keeps reconnecting, or
//! leaves handshakes half-open) would fill the 512 established and 64 pending slots and
//! lock honest newcomers out. This behaviour refuses an *inbound* connection when its IP
//! already has [`IpLimits::max_per_ip`] established inbound connections, or as many
//! handshakes in progress. Outbound connections are ours to choose and are not counted.
//!
//! Loopback is exempt when asked ([`crate::NetConfig::exempt_loopback`], the default):
//! local swarms and tests run many peers on 127.0.0.1. Denials surface as
//! `IncomingConnectionError { error: ListenError::Denied { cause } }` with an
//! [`IpLimitExceeded`] cause; the node counts them under `ip_limit`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::task::{Context, Poll};

use libp2p::core::transport::PortUse;
use libp2p::core::Endpoint;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::{
    dummy, ConnectionClosed, ConnectionDenied, ConnectionId, FromSwarm, ListenFailure,
    NetworkBehaviour, THandler, THandlerInEvent, THandlerOutEvent, ToSwarm,
};
use libp2p::{Multiaddr, PeerId};

/// Default cap of established inbound connections (and of pending handshakes) per IP.
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: u32 = 8;

/// Why an inbound connection was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{ip} already has {count} {what} connections (limit {limit} per IP)")]
pub struct IpLimitExceeded {
    pub ip: IpAddr,
    pub count: u32,
    pub limit: u32,
    /// "established" or "pending".
    pub what: &'static str,
}

/// The per-IP connection gate. See the module docs.
pub struct IpLimits {
    max_per_ip: u32,
    exempt_loopback: bool,
    pending: HashMap<ConnectionId, IpAddr>,
    established: HashMap<ConnectionId, IpAddr>,
    /// Connections per IP, pending and established, for O(1) checks.
    counts: HashMap<IpAddr, (u32, u32)>,
}

impl IpLimits {
    pub fn new(max_per_ip: u32, exempt_loopback: bool) -> Self {
        IpLimits {
            max_per_ip,
            exempt_loopback,
            pending: HashMap::new(),
            established: HashMap::new(),
            counts: HashMap::new(),
        }
    }

    /// Established inbound connections from `ip` (for tests and status).
    pub fn established_from(&self, ip: &IpAddr) -> u32 {
        self.counts.get(ip).map_or(0, |c| c.1)
    }

    fn ip_to_limit(&self, addr: &Multiaddr) -> Option<IpAddr> {
        // A circuit's address names the relay's IP: every peer behind one relay would share
        // one cap. Circuits are bounded by the relay's limits and the connection limits.
        if addr.iter().any(|p| matches!(p, Protocol::P2pCircuit)) {
            return None;
        }
        let ip = ip_of(addr)?;
        (!(self.exempt_loopback && ip.is_loopback())).then_some(ip)
    }

    fn release(&mut self, id: ConnectionId) {
        for (map, established) in [(&mut self.pending, false), (&mut self.established, true)] {
            if let Some(ip) = map.remove(&id) {
                if let Some(c) = self.counts.get_mut(&ip) {
                    let n = if established { &mut c.1 } else { &mut c.0 };
                    *n = n.saturating_sub(1);
                    if *c == (0, 0) {
                        self.counts.remove(&ip);
                    }
                }
            }
        }
    }
}

/// The IP of a multiaddr, if it has one.
pub fn ip_of(addr: &Multiaddr) -> Option<IpAddr> {
    addr.iter().find_map(|p| match p {
        Protocol::Ip4(ip) => Some(IpAddr::V4(ip)),
        Protocol::Ip6(ip) => Some(IpAddr::V6(ip)),
        _ => None,
    })
}

impl NetworkBehaviour for IpLimits {
    type ConnectionHandler = dummy::ConnectionHandler;
    type ToSwarm = Infallible;

    fn handle_pending_inbound_connection(
        &mut self,
        id: ConnectionId,
        _local: &Multiaddr,
        remote: &Multiaddr,
    ) -> Result<(), ConnectionDenied> {
        let Some(ip) = self.ip_to_limit(remote) else {
            return Ok(());
        };
        let c = self.counts.entry(ip).or_default();
        if c.0 >= self.max_per_ip {
            let count = c.0;
            return Err(ConnectionDenied::new(IpLimitExceeded {
                ip,
                count,
                limit: self.max_per_ip,
                what: "pending",
            }));
        }
        c.0 += 1;
        self.pending.insert(id, ip);
        Ok(())
    }

    fn handle_established_inbound_connection(
        &mut self,
        id: ConnectionId,
        _peer: PeerId,
        _local: &Multiaddr,
        remote: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        self.release(id);
        let Some(ip) = self.ip_to_limit(remote) else {
            return Ok(dummy::ConnectionHandler);
        };
        let c = self.counts.entry(ip).or_default();
        if c.1 >= self.max_per_ip {
            let count = c.1;
            if *c == (0, 0) {
                self.counts.remove(&ip);
            }
            return Err(ConnectionDenied::new(IpLimitExceeded {
                ip,
                count,
                limit: self.max_per_ip,
                what: "established",
            }));
        }
        c.1 += 1;
        self.established.insert(id, ip);
        Ok(dummy::ConnectionHandler)
    }

    fn handle_established_outbound_connection(
        &mut self,
        _id: ConnectionId,
        _peer: PeerId,
        _addr: &Multiaddr,
        _role: Endpoint,
        _port_use: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(dummy::ConnectionHandler)
    }

    fn on_swarm_event(&mut self, event: FromSwarm) {
        match event {
            FromSwarm::ConnectionClosed(ConnectionClosed { connection_id, .. })
            | FromSwarm::ListenFailure(ListenFailure { connection_id, .. }) => {
                self.release(connection_id)
            }
            _ => {}
        }
    }

    fn on_connection_handler_event(
        &mut self,
        _peer: PeerId,
        _id: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        libp2p::core::util::unreachable(event)
    }

    fn poll(&mut self, _: &mut Context<'_>) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(ip: &str) -> Multiaddr {
        format!("/ip4/{ip}/tcp/4001").parse().unwrap()
    }

    #[test]
    fn caps_pending_and_established_per_ip_and_frees_on_close() {
        let mut l = IpLimits::new(2, true);
        let local = addr("10.0.0.1");
        let (a, b) = (addr("10.0.0.2"), addr("10.0.0.3"));
        let ids: Vec<ConnectionId> = (1..=4).map(ConnectionId::new_unchecked).collect();
        assert!(l.handle_pending_inbound_connection(ids[0], &local, &a).is_ok());
        assert!(l.handle_pending_inbound_connection(ids[1], &local, &a).is_ok());
        assert!(l.handle_pending_inbound_connection(ids[2], &local, &a).is_err(), "pending cap");
        assert!(l.handle_pending_inbound_connection(ids[3], &local, &b).is_ok(), "other IP");
        let p = PeerId::random();
        assert!(l.handle_established_inbound_connection(ids[0], p, &local, &a).is_ok());
        assert!(l.handle_established_inbound_connection(ids[1], p, &local, &a).is_ok());
        assert_eq!(l.established_from(&ip_of(&a).unwrap()), 2);
        let extra = ConnectionId::new_unchecked(99);
        assert!(l.handle_pending_inbound_connection(extra, &local, &a).is_ok());
        assert!(l.handle_established_inbound_connection(extra, p, &local, &a).is_err());
        l.release(ids[0]);
        assert_eq!(l.established_from(&ip_of(&a).unwrap()), 1);
        let loopback = addr("127.0.0.1");
        for i in 100..110 {
            let id = ConnectionId::new_unchecked(i);
            assert!(l.handle_pending_inbound_connection(id, &local, &loopback).is_ok());
            assert!(l.handle_established_inbound_connection(id, p, &local, &loopback).is_ok());
        }
    }
}
