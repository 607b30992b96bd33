//! `atoll run`: start a peer of a run's swarm and keep `RUN_DIR/status.json` current.
//!
//! For now only `--no-train` peers run (bootstrap / relay nodes that serve the DHT, gossip
//! and blobs); training through `run` arrives with the protocol issue.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use atoll_net::limiter::mbps_to_bytes_per_sec;
use atoll_net::{identity, Multiaddr, NetConfig, NetEvent, NetStats, Node, DEFAULT_RUN_ID};
use serde::{Deserialize, Serialize};

/// Name of the status file inside the run dir.
pub const STATUS_FILE: &str = "status.json";
/// How often the status file is rewritten.
const STATUS_PERIOD: Duration = Duration::from_millis(500);

/// Arguments of `atoll run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory of this peer: key file (`peer_key`) and `status.json`.
    #[arg(long)]
    pub run_dir: PathBuf,
    /// Address to listen on (repeatable). Default: all interfaces, TCP and QUIC, OS-chosen
    /// ports.
    #[arg(long = "listen", value_name = "MULTIADDR")]
    pub listen: Vec<Multiaddr>,
    /// Peer to join through (repeatable), e.g. `/ip4/1.2.3.4/tcp/4001/p2p/12D3…`.
    #[arg(long = "bootstrap", value_name = "MULTIADDR")]
    pub bootstrap: Vec<Multiaddr>,
    /// Run a pure bootstrap/relay peer: DHT, gossip and blob serving, no training.
    #[arg(long)]
    pub no_train: bool,
    /// Which run's swarm to join. Peers started without it all join the shared default.
    #[arg(long, default_value = DEFAULT_RUN_ID)]
    pub run_id: String,
    /// Upload cap on blob transfers in megabits per second.
    #[arg(long, value_name = "MBPS")]
    pub max_upload_mbps: Option<f64>,
    /// Do not discover peers on the local network by multicast DNS.
    #[arg(long)]
    pub no_mdns: bool,
    /// Key file (default: RUN_DIR/peer_key); created if absent, so restarts keep the peer id.
    #[arg(long, value_name = "PATH")]
    pub key_file: Option<PathBuf>,
}

/// What `status.json` holds: the node's snapshot plus liveness.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusFile {
    /// False once the peer has shut down cleanly.
    pub running: bool,
    /// Process id of the peer.
    pub pid: u32,
    /// When the file was written (milliseconds since the Unix epoch).
    pub updated_unix_ms: u64,
    #[serde(flatten)]
    pub stats: NetStats,
}

pub fn main(args: Args) -> anyhow::Result<()> {
    if !args.no_train {
        bail!(
            "training through `atoll run` arrives with the protocol issue; for now use \
             `atoll run --no-train` for a bootstrap/relay peer, or `atoll train` to train alone"
        );
    }
    if let Some(mbps) = args.max_upload_mbps {
        if !(mbps.is_finite() && mbps > 0.0) {
            bail!("--max-upload-mbps must be a positive number, got {mbps}");
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.run_dir)
        .with_context(|| format!("cannot create run dir {}", args.run_dir.display()))?;
    let key_path =
        args.key_file.clone().unwrap_or_else(|| args.run_dir.join(identity::KEY_FILE_NAME));
    let key = identity::load_or_create(&key_path)?;
    let mut cfg = NetConfig::new(key, args.run_id.clone());
    cfg.listen = if args.listen.is_empty() {
        vec!["/ip4/0.0.0.0/tcp/0".parse()?, "/ip4/0.0.0.0/udp/0/quic-v1".parse()?]
    } else {
        args.listen.clone()
    };
    cfg.bootstrap = args.bootstrap.clone();
    cfg.mdns = !args.no_mdns;
    cfg.max_upload_bytes_per_sec = args.max_upload_mbps.map(mbps_to_bytes_per_sec);

    let mut node = Node::start(cfg).await.context("cannot start the peer")?;
    println!("peer_id {}", node.client.peer_id());
    for a in &node.listen_addrs {
        println!("listening {a}");
    }
    let status_path = args.run_dir.join(STATUS_FILE);
    let mut tick = tokio::time::interval(STATUS_PERIOD);
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install the SIGTERM handler")?;
    loop {
        tokio::select! {
            biased;
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
            _ = tick.tick() => {
                let stats = node.client.stats().await?;
                write_status(&status_path, true, stats)?;
            }
            Some(event) = node.events.recv() => log_event(&event),
        }
    }
    tracing::info!("stopping");
    let last = node.client.stats().await?;
    node.handle.shutdown().await?;
    write_status(&status_path, false, last)?;
    Ok(())
}

fn log_event(event: &NetEvent) {
    match event {
        NetEvent::RunPeerJoined(p) => tracing::debug!(peer = %p, "run peer joined"),
        NetEvent::RunPeerLeft(p) => tracing::debug!(peer = %p, "run peer left"),
        NetEvent::Announcement { from, payload, .. } => {
            tracing::debug!(from = %from, bytes = payload.len(), "announcement")
        }
        other => tracing::info!(event = ?other, "network event"),
    }
}

/// Writes the status file atomically: a reader sees the old or the new file, never half.
fn write_status(path: &Path, running: bool, stats: NetStats) -> anyhow::Result<()> {
    let status = StatusFile {
        running,
        pid: std::process::id(),
        updated_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        stats,
    };
    let tmp = path.with_extension("json.tmp");
    let json = serde_json::to_vec_pretty(&status)?;
    std::fs::write(&tmp, json).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))?;
    Ok(())
}
