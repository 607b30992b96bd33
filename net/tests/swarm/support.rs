//! Helpers: start loopback nodes, wait for conditions with a deadline, seeded data.

use std::future::Future;
use std::time::Duration;

use libp2p::{gossipsub, noise, tcp, yamux, Swarm, SwarmBuilder};

use atoll_net::{Multiaddr, NetConfig, NetEvent, Node, PeerId};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Deadline for anything a test waits for.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Options of a test node.
pub struct Opts {
    pub run_name: &'static str,
    pub bootstrap: Vec<Multiaddr>,
    pub listen: &'static str,
    pub upload_bytes_per_sec: Option<u64>,
    /// Fault injection: the node's block-list file.
    pub block_list: Option<std::path::PathBuf>,
    /// The node's identity (default: a fresh one).
    pub key: Option<libp2p::identity::Keypair>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            run_name: "test-run",
            bootstrap: Vec::new(),
            listen: "/ip4/127.0.0.1/tcp/0",
            upload_bytes_per_sec: None,
            block_list: None,
            key: None,
        }
    }
}

/// Starts a node on loopback with fast discovery and mDNS off.
pub async fn start(opts: Opts) -> anyhow::Result<Node> {
    let key = match opts.key {
        Some(k) => k,
        None => atoll_net::identity::load_or_create(&tempfile::tempdir()?.path().join("peer_key"))?,
    };
    let mut cfg = NetConfig::new(key, opts.run_name);
    cfg.listen = vec![opts.listen.parse()?];
    cfg.bootstrap = opts.bootstrap;
    cfg.discovery_interval = Duration::from_millis(500);
    cfg.max_upload_bytes_per_sec = opts.upload_bytes_per_sec;
    cfg.block_list = opts.block_list;
    Ok(Node::start(cfg).await?)
}

/// Starts a node bootstrapped from `from`.
pub async fn start_from(from: &Node) -> anyhow::Result<Node> {
    start(Opts { bootstrap: vec![from.listen_addrs[0].clone()], ..Opts::default() }).await
}

/// Polls `check` until it returns true or the deadline passes.
pub async fn wait_until<F, Fut>(what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut poll = tokio::time::interval(Duration::from_millis(50));
    loop {
        poll.tick().await;
        if check().await? {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("timed out after {DEADLINE:?} waiting for: {what}");
        }
    }
}

/// Waits for the first event that `pick` accepts.
pub async fn next_event<T>(
    node: &mut Node,
    mut pick: impl FnMut(NetEvent) -> Option<T>,
) -> anyhow::Result<T> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let ev = tokio::time::timeout_at(deadline, node.events.recv())
            .await
            .map_err(|_| anyhow::anyhow!("no matching event within {DEADLINE:?}"))?
            .ok_or_else(|| anyhow::anyhow!("event stream closed"))?;
        if let Some(t) = pick(ev) {
            return Ok(t);
        }
    }
}

/// True when `node` lists exactly `others` as run peers.
pub async fn sees_exactly(node: &Node, others: &[PeerId]) -> anyhow::Result<bool> {
    let mut peers = node.client.run_peers().await?;
    let mut want = others.to_vec();
    peers.sort();
    want.sort();
    Ok(peers == want)
}

/// Seeded pseudo-random bytes.
pub fn seeded_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// Stops all nodes, awaiting each.
pub async fn stop_all(nodes: Vec<Node>) -> anyhow::Result<()> {
    for n in nodes {
        n.handle.shutdown().await?;
    }
    Ok(())
}

/// A bare gossipsub peer that sends whatever bytes it is told to, up to 256 KiB.
pub fn bare_gossip_peer() -> anyhow::Result<Swarm<gossipsub::Behaviour>> {
    Ok(SwarmBuilder::with_new_identity()
        .with_tokio()
        .with_tcp(tcp::Config::default(), noise::Config::new, yamux::Config::default)?
        .with_behaviour(|key| {
            let cfg = gossipsub::ConfigBuilder::default()
                .max_transmit_size(256 * 1024)
                .build()
                .expect("valid gossipsub config");
            gossipsub::Behaviour::new(gossipsub::MessageAuthenticity::Signed(key.clone()), cfg)
                .expect("valid gossipsub behaviour")
        })?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(60)))
        .build())
}
