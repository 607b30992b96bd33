//! Joining a run in one line: `atoll run --join RUN_ID@MULTIADDR`.
//!
//! The run id is the blake3 of the manifest's canonical bytes, and every peer that knows
//! the manifest stores exactly those bytes in its atoll-net blob store, whose blob hashes
//! are plain blake3: the manifest's blob hash *is* the run id. A joiner therefore fetches
//! the blob named by the id it was given from the peer at the address; atoll-net verifies
//! every byte against the hash, so the peer cannot substitute another manifest. The bytes
//! are still parsed as a stranger's (bounded, every setting validated) and must be the
//! canonical form of what they parse to.
//!
//! Which run a peer serves is learnt first, from identify (see `atoll_net::advert`), so a
//! wrong id is refused naming both ids, and a peer that cannot be reached is reported with
//! each address tried and libp2p's reason.
//!
//! The fetch runs on a short-lived node: the run name (gossip topic, DHT key) that the
//! real peer needs is in the manifest it does not have yet, and atoll-net fixes both at
//! start. The short-lived node uses the peer's own key (an allow-listed run admits it).

mod target;

pub use target::{JoinTarget, TargetError};

use std::collections::HashMap;
use std::time::Duration;

use atoll_net::{BlobHash, Multiaddr, NetConfig, NetError, NetEvent, Node, PeerId};

use crate::manifest::{Manifest, ManifestError, RunId, MAX_BYTES};

/// How long a joiner waits for the peers it was given before it says why it gave up.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the short-lived node's failed dials are looked at.
const POLL: Duration = Duration::from_millis(200);

/// What became of one address a joiner tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub addr: Multiaddr,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// No answer yet (at the deadline: none in time).
    Waiting,
    /// The dial failed; libp2p's reason.
    Unreachable(String),
    /// Reached; it serves another run (this manifest hash).
    OtherRun(RunId),
    /// Reached, but it could not give us the manifest.
    NoManifest(String),
}

impl std::fmt::Display for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.outcome {
            Outcome::Waiting => {
                write!(f, "{}: no answer within {} s", self.addr, JOIN_TIMEOUT.as_secs())
            }
            Outcome::Unreachable(why) => write!(f, "{}: unreachable: {why}", self.addr),
            Outcome::OtherRun(id) => write!(f, "{}: serves run {}", self.addr, id.hex()),
            Outcome::NoManifest(why) => write!(f, "{}: reached, but no manifest: {why}", self.addr),
        }
    }
}

fn list(attempts: &[Attempt]) -> String {
    attempts.iter().map(|a| format!("\n  {a}")).collect()
}

/// The attempts other than the one at `addr`, if any.
fn also(attempts: &[Attempt], addr: &Multiaddr) -> String {
    let others: Vec<Attempt> = attempts.iter().filter(|a| a.addr != *addr).cloned().collect();
    if others.is_empty() {
        String::new()
    } else {
        format!("\nAlso tried:{}", list(&others))
    }
}

/// Why a join could not get the run's manifest.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    #[error(transparent)]
    Net(#[from] NetError),
    #[error(
        "wrong run id: you asked for run {given}, but the peer at {addr} serves run {served}; \
         check the id (every training peer prints its own `--join` line at start){}",
        also(.attempts, .addr)
    )]
    WrongRun { given: String, served: String, addr: Multiaddr, attempts: Vec<Attempt> },
    #[error(
        "cannot get the manifest of run {run} from any peer. Tried:{}\nCheck that the \
         address is the one a running peer printed, that the peer is still running and that \
         no firewall blocks its port; a --no-train peer serves the manifest only when \
         started with --config",
        list(.attempts)
    )]
    NoneReached { run: String, attempts: Vec<Attempt> },
    #[error("the manifest served by {addr} is not valid: {source}")]
    Manifest { addr: Multiaddr, source: ManifestError },
    #[error(
        "the manifest served by {addr} hashes to the run id but is not in canonical form \
         (no honest peer serves that)"
    )]
    NotCanonical { addr: Multiaddr },
}

/// Fetches the manifest of run `run` from the peers at `addrs` (each ending in
/// `/p2p/<peer id>`), on a short-lived node built from `cfg` (its listen, bootstrap and
/// mDNS settings are ignored). Gives up after `within`.
pub async fn fetch_manifest(
    mut cfg: NetConfig,
    run: RunId,
    addrs: &[JoinTarget],
    within: Duration,
) -> Result<Manifest, JoinError> {
    cfg.listen.clear();
    cfg.bootstrap.clear();
    cfg.mdns = false;
    cfg.manifest = None;
    // A topic and DHT key of its own: this node is no peer of any run.
    cfg.run_name = format!("join-{}", run.short());
    let mut node = Node::start(cfg).await?;
    let result = fetch_on(&mut node, run, addrs, within).await;
    node.handle.shutdown().await?;
    result
}

async fn fetch_on(
    node: &mut Node,
    run: RunId,
    targets: &[JoinTarget],
    within: Duration,
) -> Result<Manifest, JoinError> {
    let deadline = tokio::time::Instant::now() + within;
    let mut attempts: Vec<Attempt> = targets
        .iter()
        .map(|t| Attempt { addr: t.addr.clone(), outcome: Outcome::Waiting })
        .collect();
    let index: HashMap<PeerId, usize> =
        targets.iter().enumerate().map(|(i, t)| (t.peer, i)).collect();
    for (i, t) in targets.iter().enumerate() {
        match node.client.dial(t.addr.clone()).await {
            Ok(()) => {}
            Err(NetError::Dial { reason, .. }) => {
                attempts[i].outcome = Outcome::Unreachable(reason)
            }
            Err(e) => attempts[i].outcome = Outcome::Unreachable(e.to_string()),
        }
    }
    let mut tick = tokio::time::interval(POLL);
    let wanted = BlobHash(run.0);
    while attempts.iter().any(|a| a.outcome == Outcome::Waiting) {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => break,
            event = node.events.recv() => {
                let Some(event) = event else { break };
                let NetEvent::PeerIdentified { peer, manifest } = event else { continue };
                let Some(&i) = index.get(&peer) else { continue };
                if attempts[i].outcome != Outcome::Waiting {
                    continue;
                }
                if let Some(h) = manifest.filter(|h| *h != wanted) {
                    attempts[i].outcome = Outcome::OtherRun(RunId(h.0));
                    continue;
                }
                // It serves our run, or did not say (then it may still hold the blob).
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let got = tokio::time::timeout(
                    left,
                    node.client.fetch_blob_limited(wanted, &[peer], MAX_BYTES as u64),
                )
                .await;
                match got {
                    Ok(Ok(bytes)) => return accept(&bytes, run, &targets[i].addr),
                    Ok(Err(e)) => attempts[i].outcome = Outcome::NoManifest(e.to_string()),
                    Err(_) => break,
                }
            }
            _ = tick.tick() => {
                for f in node.client.stats().await?.dial_failures {
                    let Some(&i) = f.peer.and_then(|p| p.parse().ok()).and_then(|p| index.get(&p)) else {
                        continue;
                    };
                    if attempts[i].outcome == Outcome::Waiting {
                        attempts[i].outcome = Outcome::Unreachable(f.error);
                    }
                }
            }
        }
    }
    let other = attempts.iter().find_map(|a| match a.outcome {
        Outcome::OtherRun(id) => Some((a.addr.clone(), id)),
        _ => None,
    });
    Err(match other {
        Some((addr, served)) => {
            JoinError::WrongRun { given: run.hex(), served: served.hex(), addr, attempts }
        }
        None => JoinError::NoneReached { run: run.hex(), attempts },
    })
}

/// The fetched bytes (already verified against the run id) as a manifest.
fn accept(bytes: &[u8], run: RunId, addr: &Multiaddr) -> Result<Manifest, JoinError> {
    let manifest = Manifest::from_bytes(bytes)
        .map_err(|source| JoinError::Manifest { addr: addr.clone(), source })?;
    if manifest.run_id() != run {
        return Err(JoinError::NotCanonical { addr: addr.clone() });
    }
    Ok(manifest)
}

/// The command a newcomer runs to join the run `run` through this peer, given the peer's
/// listen addresses: the first TCP address off loopback, else any off loopback, else a
/// loopback one (a swarm on one machine).
pub fn join_line(run: RunId, listen: &[Multiaddr]) -> Option<String> {
    use atoll_net::multiaddr::Protocol;
    let loopback = |a: &Multiaddr| {
        a.iter().any(|p| match p {
            Protocol::Ip4(ip) => ip.is_loopback(),
            Protocol::Ip6(ip) => ip.is_loopback(),
            _ => false,
        })
    };
    let tcp = |a: &Multiaddr| a.iter().any(|p| matches!(p, Protocol::Tcp(_)));
    let addr = listen
        .iter()
        .find(|a| !loopback(a) && tcp(a))
        .or_else(|| listen.iter().find(|a| !loopback(a)))
        .or_else(|| listen.iter().find(|a| tcp(a)))
        .or_else(|| listen.first())?;
    Some(format!("atoll run --run-dir runs/{} --join {}@{addr}", run.short(), run.hex()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Corpus;
    use crate::train::TrainConfig;

    fn manifest() -> Manifest {
        let corpus = Corpus::from_text("t", b"hello world, hello swarm".repeat(50)).unwrap();
        Manifest::new("join-unit", TrainConfig::tiny(3), &corpus, Default::default())
    }

    #[test]
    fn only_the_canonical_bytes_of_a_valid_manifest_are_accepted() {
        let addr: Multiaddr = "/ip4/127.0.0.1/tcp/1".parse().unwrap();
        let m = manifest();
        assert_eq!(accept(&m.to_bytes(), m.run_id(), &addr).unwrap(), m);
        // The same manifest pretty-printed: it parses, but its hash is not its run id.
        let pretty = serde_json::to_vec_pretty(&m).unwrap();
        let id = RunId(*blake3::hash(&pretty).as_bytes());
        assert!(matches!(accept(&pretty, id, &addr), Err(JoinError::NotCanonical { .. })));
        let mut bad = m.clone();
        bad.protocol.quorum = 0;
        let e = accept(&bad.to_bytes(), bad.run_id(), &addr).unwrap_err();
        assert!(e.to_string().contains("quorum"), "{e}");
        assert!(accept(b"not json", m.run_id(), &addr).is_err());
    }

    #[test]
    fn the_join_line_names_the_best_address_and_the_whole_id() {
        let id = manifest().run_id();
        let p = "/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA";
        let a = |s: &str| -> Multiaddr { format!("{s}{p}").parse().unwrap() };
        let lo_tcp = a("/ip4/127.0.0.1/tcp/1");
        let lan_quic = a("/ip4/10.0.0.2/udp/2/quic-v1");
        let lan_tcp = a("/ip4/10.0.0.2/tcp/3");
        let line = |addrs: &[Multiaddr]| join_line(id, addrs).unwrap();
        let want = |addr: &Multiaddr| {
            format!("atoll run --run-dir runs/{} --join {}@{addr}", id.short(), id.hex())
        };
        assert_eq!(line(&[lo_tcp.clone(), lan_quic.clone(), lan_tcp.clone()]), want(&lan_tcp));
        assert_eq!(line(&[lo_tcp.clone(), lan_quic.clone()]), want(&lan_quic));
        assert_eq!(line(std::slice::from_ref(&lo_tcp)), want(&lo_tcp));
        assert_eq!(join_line(id, &[]), None);
        // What a peer prints parses back to the same target.
        let printed = line(std::slice::from_ref(&lan_tcp));
        let target: JoinTarget = printed.rsplit(' ').next().unwrap().parse().unwrap();
        assert_eq!((target.run, target.addr), (id, lan_tcp));
    }
}
