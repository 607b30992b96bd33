//! Connection caps per remote host and per network: one host, or one network's worth of
//! addresses, cannot fill our connection slots.
//!
//! `connection_limits` caps connections per peer id and in all, but peer ids are free: a
//! host that opens hundreds of connections under fresh ids (or keeps reconnecting, or
//! leaves handshakes half-open) would fill the 512 established and 64 pending slots and
//! lock honest newcomers out. This behaviour refuses an *inbound* connection when its host
//! already has [`IpLimits::max_per_ip`] established inbound connections, or as many
//! handshakes in progress, or when its network already has [`NET_FACTOR`] times that.
//! A host is an IPv4 address or an IPv6 /64 (one subscriber's usual allocation, so that
//! one machine cannot take a fresh address per connection); a network is an IPv4 /24 or
//! an IPv6 /48. Outbound connections are ours to choose and are not counted.
//!
//! Half of the pending slots are kept for regions with no handshake in progress (a region:
//! an IPv4 /16, an IPv6 /32, an ISP's allocation): once half of them are taken, a region
//! that has one gets no more until the count falls back. A silent socket holds a pending
//! slot for up to the upgrade timeout (10 s), and a reconnect flood takes every freed slot
//! again within a millisecond: without the reserve, 16 addresses in 16 /24s (8 addresses in
//! two would do) kept a newcomer out for 20 s and more (`tests/swarm/accept_flood.rs`).
//! With it, no more than half the table is held plus one slot per region that holds any:
//! filling the 64 slots takes 32 regions. The reserve once counted networks (/24, /48):
//! then one IPv6 /43, 32 /48s, filled the table; a /32 is what a registry hands an ISP.
//!
//! Loopback is exempt when asked ([`crate::NetConfig::exempt_loopback`], the default):
//! local swarms and tests run many peers on 127.0.0.1. Denials surface as
//! `IncomingConnectionError { error: ListenError::Denied { cause } }` with an
//! [`IpLimitExceeded`] cause; the node counts them under `ip_limit`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::task::{Context, Poll};

use libp2p::core::transport::PortUse;
use libp2p::core::Endpoint;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::{
    dummy, ConnectionClosed, ConnectionDenied, ConnectionId, FromSwarm, ListenFailure,
    NetworkBehaviour, THandler, THandlerInEvent, THandlerOutEvent, ToSwarm,
};
use libp2p::{Multiaddr, PeerId};

/// Default cap of established inbound connections (and of pending handshakes) per host.
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: u32 = 8;
/// A network may hold this many times a host's cap.
pub const NET_FACTOR: u32 = 4;
/// Once this fraction (1/n) of the pending slots is taken, only networks with nothing
/// pending are admitted.
pub const PENDING_RESERVE_DIVISOR: u32 = 2;

/// Why an inbound connection was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{ip} already has {count} {what} connections from its {scope} (limit {limit})")]
pub struct IpLimitExceeded {
    pub ip: IpAddr,
    pub count: u32,
    pub limit: u32,
    /// "established" or "pending".
    pub what: &'static str,
    /// "host" (IPv4 address, IPv6 /64) or "network" (IPv4 /24, IPv6 /48), or the network
    /// while the pending slots are half taken.
    pub scope: &'static str,
}

/// Where a connection comes from, at the two granularities that are capped and the one
/// the pending reserve counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Source {
    ip: IpAddr,
    host: IpAddr,
    net: IpAddr,
    region: IpAddr,
}

impl Source {
    fn of(ip: IpAddr) -> Self {
        let (host, net, region) = match ip {
            IpAddr::V4(v4) => {
                let bits = u32::from(v4);
                let mask = |len: u32| IpAddr::V4(Ipv4Addr::from(bits & (u32::MAX << (32 - len))));
                (ip, mask(24), mask(16))
            }
            IpAddr::V6(v6) => {
                let bits = u128::from(v6);
                let mask = |len: u32| IpAddr::V6(Ipv6Addr::from(bits & (u128::MAX << (128 - len))));
                (mask(64), mask(48), mask(32))
            }
        };
        Source { ip, host, net, region }
    }
}

/// Pending and established inbound connections of one host or network.
type Counts = HashMap<IpAddr, (u32, u32)>;

/// The per-host and per-network connection gate. See the module docs.
pub struct IpLimits {
    max_per_ip: u32,
    exempt_loopback: bool,
    /// The swarm's cap of pending inbound connections, half of which is kept for networks
    /// with nothing pending.
    max_pending: u32,
    pending: HashMap<ConnectionId, Source>,
    established: HashMap<ConnectionId, Source>,
    /// Connections per host and per network, pending and established, for O(1) checks.
    hosts: Counts,
    nets: Counts,
    /// Pending connections per region (what the reserve counts).
    regions: HashMap<IpAddr, u32>,
}

impl IpLimits {
    /// `max_pending`: the swarm's cap of pending inbound connections (see the module docs).
    pub fn new(max_per_ip: u32, exempt_loopback: bool, max_pending: u32) -> Self {
        IpLimits {
            max_per_ip,
            exempt_loopback,
            max_pending,
            pending: HashMap::new(),
            established: HashMap::new(),
            hosts: HashMap::new(),
            nets: HashMap::new(),
            regions: HashMap::new(),
        }
    }

    /// Established inbound connections from `ip`'s host (for tests and status).
    pub fn established_from(&self, ip: &IpAddr) -> u32 {
        self.hosts.get(&Source::of(*ip).host).map_or(0, |c| c.1)
    }

    fn source_to_limit(&self, addr: &Multiaddr) -> Option<Source> {
        // A circuit's address names the relay's IP: every peer behind one relay would share
        // one cap. Circuits are bounded by the relay's limits and the connection limits.
        if addr.iter().any(|p| matches!(p, Protocol::P2pCircuit)) {
            return None;
        }
        let ip = ip_of(addr)?;
        (!(self.exempt_loopback && ip.is_loopback())).then(|| Source::of(ip))
    }

    /// Counts one more connection from `src` (`established` or pending), unless its host or
    /// network is at its cap.
    fn admit(&mut self, src: Source, established: bool) -> Result<(), IpLimitExceeded> {
        let what = if established { "established" } else { "pending" };
        let caps = [
            (&self.hosts, src.host, self.max_per_ip, "host"),
            (&self.nets, src.net, self.max_per_ip.saturating_mul(NET_FACTOR), "network"),
        ];
        for (counts, key, limit, scope) in caps {
            let c = counts.get(&key).copied().unwrap_or_default();
            let count = if established { c.1 } else { c.0 };
            if count >= limit {
                return Err(IpLimitExceeded { ip: src.ip, count, limit, what, scope });
            }
        }
        let reserved = self.pending.len() as u32 >= self.max_pending / PENDING_RESERVE_DIVISOR;
        let region_pending = self.regions.get(&src.region).copied().unwrap_or(0);
        if !established && reserved && region_pending > 0 {
            let scope = "region (IPv4 /16, IPv6 /32) while half the pending slots are taken";
            let count = region_pending;
            return Err(IpLimitExceeded { ip: src.ip, count, limit: 1, what, scope });
        }
        for (counts, key) in [(&mut self.hosts, src.host), (&mut self.nets, src.net)] {
            let c = counts.entry(key).or_default();
            let n = if established { &mut c.1 } else { &mut c.0 };
            *n += 1;
        }
        if !established {
            *self.regions.entry(src.region).or_default() += 1;
        }
        Ok(())
    }

    fn release(&mut self, id: ConnectionId) {
        for (map, established) in [(&mut self.pending, false), (&mut self.established, true)] {
            let Some(src) = map.remove(&id) else { continue };
            if !established {
                if let Some(n) = self.regions.get_mut(&src.region) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        self.regions.remove(&src.region);
                    }
                }
            }
            for (counts, key) in [(&mut self.hosts, src.host), (&mut self.nets, src.net)] {
                if let Some(c) = counts.get_mut(&key) {
                    let n = if established { &mut c.1 } else { &mut c.0 };
                    *n = n.saturating_sub(1);
                    if *c == (0, 0) {
                        counts.remove(&key);
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
        let Some(src) = self.source_to_limit(remote) else {
            return Ok(());
        };
        self.admit(src, false).map_err(ConnectionDenied::new)?;
        self.pending.insert(id, src);
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
        let Some(src) = self.source_to_limit(remote) else {
            return Ok(dummy::ConnectionHandler);
        };
        self.admit(src, true).map_err(ConnectionDenied::new)?;
        self.established.insert(id, src);
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

    fn addr6(ip: &str) -> Multiaddr {
        format!("/ip6/{ip}/tcp/4001").parse().unwrap()
    }

    /// Pending connections admitted from `addrs` in turn, each with a fresh id.
    fn admitted(l: &mut IpLimits, addrs: &[Multiaddr]) -> usize {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1000);
        let local = addr("10.0.0.1");
        let ids = std::iter::repeat_with(|| {
            ConnectionId::new_unchecked(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
        });
        addrs
            .iter()
            .zip(ids)
            .filter(|(a, id)| l.handle_pending_inbound_connection(*id, &local, a).is_ok())
            .count()
    }

    /// Fresh addresses of one /24, or of one IPv6 /64, count against one network's or one
    /// host's cap; other networks are not affected.
    #[test]
    fn caps_networks_and_ipv6_hosts() {
        let mut l = IpLimits::new(2, true, 64);
        let one_24: Vec<Multiaddr> = (2..40).map(|i| addr(&format!("10.1.2.{i}"))).collect();
        assert_eq!(admitted(&mut l, &one_24), 2 * NET_FACTOR as usize, "per /24");
        assert_eq!(admitted(&mut l, &[addr("10.1.3.2")]), 1, "the next /24 is its own");
        let one_64: Vec<Multiaddr> =
            (1..20).map(|i| addr6(&format!("2001:db8:0:1::{i:x}"))).collect();
        assert_eq!(admitted(&mut l, &one_64), 2, "a /64 is one host");
        let one_48: Vec<Multiaddr> =
            (1..40).map(|i| addr6(&format!("2001:db8:0:{i:x}::1"))).collect();
        assert_eq!(admitted(&mut l, &one_48), 2 * NET_FACTOR as usize - 2, "per /48");
    }

    /// Once half the pending slots are taken, only regions with nothing pending get one:
    /// 16 hosts in 16 /24s hold at most 32 of 64, and a newcomer's region still gets in.
    #[test]
    fn half_the_pending_slots_are_kept_for_regions_with_nothing_pending() {
        let mut l = IpLimits::new(8, false, 64);
        let flood: Vec<Multiaddr> =
            (0..20).flat_map(|_| (2..18).map(|n| addr(&format!("10.{n}.0.10")))).collect();
        assert_eq!(admitted(&mut l, &flood), 32, "16 regions take half the table");
        let newcomer = addr("10.99.9.9");
        assert_eq!(admitted(&mut l, &[newcomer.clone(), newcomer]), 1, "one per fresh region");
        assert_eq!(admitted(&mut l, &[addr("10.100.10.1"), addr("10.100.11.2")]), 1);
        // Below half again (34 - 10), a network takes more than one, up to half.
        let ids: Vec<ConnectionId> = l.pending.keys().copied().take(10).collect();
        for id in ids {
            l.release(id);
        }
        let one_24: Vec<Multiaddr> = (100..120).map(|i| addr(&format!("10.2.0.{i}"))).collect();
        assert_eq!(admitted(&mut l, &one_24), 8);
        assert_eq!(l.regions.values().sum::<u32>() as usize, l.pending.len(), "counted once each");
    }

    /// The reserve counts IPv6 /32s: one /43's 32 /48s (or a /24's worth of IPv4 /24s,
    /// all in one /16) take half the pending slots plus one, not the whole table.
    #[test]
    fn many_networks_of_one_region_do_not_fill_the_pending_slots() {
        let mut l = IpLimits::new(8, false, 64);
        let one_43: Vec<Multiaddr> = (0..20)
            .flat_map(|_| (0..32).map(|n| addr6(&format!("2001:db8:{:x}::{n:x}", n))))
            .collect();
        assert_eq!(admitted(&mut l, &one_43), 32, "one region: half the table");
        let one_16: Vec<Multiaddr> =
            (0..4).flat_map(|_| (0..64).map(|n| addr(&format!("10.7.{n}.1")))).collect();
        assert_eq!(admitted(&mut l, &one_16), 1, "another region: one slot");
        assert_eq!(admitted(&mut l, &[addr6("2001:db9::1")]), 1, "a newcomer still gets in");
    }

    #[test]
    fn caps_pending_and_established_per_ip_and_frees_on_close() {
        let mut l = IpLimits::new(2, true, 64);
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
