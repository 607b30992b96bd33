//! What a multiaddr says about where it leads: the loopback interface, or every interface.
//! Shared by the behaviour's settings and the swarm task, so it sits below both.

use libp2p::multiaddr::Protocol;
use libp2p::Multiaddr;

/// True when the address is on the loopback interface.
pub(crate) fn is_loopback(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| match p {
        Protocol::Ip4(ip) => ip.is_loopback(),
        Protocol::Ip6(ip) => ip.is_loopback(),
        _ => false,
    })
}

/// True for `0.0.0.0` / `::` (listening there includes loopback).
pub(crate) fn is_unspecified(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| match p {
        Protocol::Ip4(ip) => ip.is_unspecified(),
        Protocol::Ip6(ip) => ip.is_unspecified(),
        _ => false,
    })
}
