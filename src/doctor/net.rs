//! The network checks: reachable peers, NAT and relay, islands.

use std::collections::HashSet;

use atoll_net::Reachability;

use super::{count, finding, fresh, secs, Check, Finding, Severity};
use super::{fresh_ms, ISLAND_AFTER_MS, NO_PEER_AFTER_MS};
use crate::heartbeat::short_peer;
use crate::heartbeat::table::SwarmView;
use crate::rundir::status::StatusFile;

pub(super) fn no_reachable_peer(s: &StatusFile, swarm: Option<&SwarmView>) -> Option<Finding> {
    let st = &s.stats;
    let alone_ms = match swarm {
        Some(v) => v.alone_since_unix_ms.map(|t| v.updated_unix_ms.saturating_sub(t))?,
        None if st.run_peers.is_empty() => st.uptime_secs.saturating_mul(1000),
        None => return None,
    };
    if alone_ms < NO_PEER_AFTER_MS {
        return None;
    }
    let boot =
        if st.bootstrap.is_empty() { "none given".to_owned() } else { st.bootstrap.join(", ") };
    let saw = format!(
        "no peer of run {:?} connected for {}; {} connected in all, {} in the routing \
         table; bootstrap addresses: {boot}",
        st.run_name,
        secs(alone_ms),
        count(st.connected, "peer"),
        st.routing_table_size
    );
    let mut fix = if st.bootstrap.is_empty() {
        "give the address of a running peer with --bootstrap MULTIADDR (`atoll status` on \
         that peer prints it under `listen`); without one only mDNS finds peers, and only on \
         the local network"
            .to_owned()
    } else {
        "check that a peer is running at the bootstrap address, that its IP, port and /p2p/ \
         peer id are right (`atoll status` on it prints them) and that no firewall blocks the \
         port; this peer's log says why each dial failed"
            .to_owned()
    };
    if st.connected > 0 {
        fix += &format!(
            "; it is connected to {} of other runs: check that every peer uses the same \
             run name",
            count(st.connected, "peer")
        );
    }
    Some(finding(Check::NoReachablePeer, Severity::Problem, saw, fix))
}

pub(super) fn nat_without_relay(s: &StatusFile) -> Option<Finding> {
    let st = &s.stats;
    if st.reachability != Reachability::Private || !st.relay.reservations.is_empty() {
        return None;
    }
    let saw = format!(
        "AutoNAT found this peer not reachable from outside (private) and it holds no relay \
         reservation; {} connected",
        count(st.run_peers.len(), "run peer")
    );
    let fix = "peers behind other NATs cannot reach it: bootstrap from a publicly reachable \
               `atoll run --no-train` peer (it relays by default), or forward a port to this \
               machine and listen on it (--listen)"
        .to_owned();
    Some(finding(Check::NatWithoutRelay, Severity::Problem, saw, fix))
}

pub(super) fn islands(swarm: Option<&SwarmView>) -> Option<Finding> {
    let v = swarm?;
    let at = v.updated_unix_ms;
    let connected: HashSet<&str> = v.connected.iter().map(|c| c.peer.as_str()).collect();
    let heard: HashSet<&str> = fresh(v).iter().map(|p| p.peer.as_str()).collect();
    let heard_only: Vec<&str> = fresh(v)
        .iter()
        .filter(|p| at.saturating_sub(p.first_heard_unix_ms) >= ISLAND_AFTER_MS)
        .map(|p| p.peer.as_str())
        .filter(|p| !connected.contains(p))
        .collect();
    let silent: Vec<&str> = v
        .connected
        .iter()
        .filter(|c| at.saturating_sub(c.since_unix_ms) >= ISLAND_AFTER_MS)
        .map(|c| c.peer.as_str())
        .filter(|p| !heard.contains(p))
        .collect();
    if heard_only.is_empty() && silent.is_empty() {
        return None;
    }
    let names = |v: &[&str]| v.iter().take(3).map(|p| short_peer(p)).collect::<Vec<_>>().join(", ");
    let mut saw = Vec::new();
    if !heard_only.is_empty() {
        saw.push(format!(
            "{} heard by heartbeat for over {}, not connected ({})",
            count(heard_only.len(), "peer"),
            secs(ISLAND_AFTER_MS),
            names(&heard_only)
        ));
    }
    if !silent.is_empty() {
        saw.push(format!(
            "{} connected for over {}, no heartbeat in {} ({})",
            count(silent.len(), "run peer"),
            secs(ISLAND_AFTER_MS),
            secs(fresh_ms(v.peers.len())),
            names(&silent)
        ));
    }
    let fix = "peers heard but not connected are reached through others only: discovery \
               cannot dial them (NAT without relay on both sides, or a split DHT) — see their \
               reachability in `atoll status --swarm` and give both sides a common \
               bootstrap/relay peer; connected peers that stay silent run an atoll without \
               heartbeats (compare versions) or the gossip mesh does not carry them"
        .to_owned();
    Some(finding(Check::Islands, Severity::Warning, saw.join("; "), fix))
}
