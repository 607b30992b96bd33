//! `atoll run`: start a peer of a run's swarm and keep `RUN_DIR/status.json` current.
//!
//! A training peer (the default) trains its shard and merges with the swarm (see
//! [`atoll::node`]); `--no-train` starts a bootstrap/relay peer that serves the DHT, gossip
//! and blobs without training.

mod join;
mod web;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use atoll::backend::Backend;
use atoll::data::Shard;
use atoll::manifest::{self, Manifest};
use atoll::node::{self, NodeOptions};
use atoll::train::TrainConfig;
use atoll_net::limiter::mbps_to_bytes_per_sec;
use atoll_net::{identity, Multiaddr, NetConfig, NetEvent, Node, DEFAULT_RUN_NAME};

/// Shards of the data when `--shard` is not given: a peer takes the one its peer id hashes
/// to, so restarts keep their shard.
const DEFAULT_SHARDS: u32 = 16;

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
    /// Join a running swarm in one line: fetch the run's manifest by its id (64 hex digits)
    /// from the peer at MULTIADDR (ending in /p2p/<peer id>), check it, save it as
    /// RUN_DIR/manifest.json and bootstrap from that peer. Every training peer prints its
    /// own line at start ("others join with: …").
    #[arg(long, value_name = "RUN_ID@MULTIADDR", conflicts_with = "config")]
    pub join: Option<atoll::join::JoinTarget>,
    /// Run a pure bootstrap/relay peer: DHT, gossip and blob serving, no training.
    #[arg(long)]
    pub no_train: bool,
    /// Name of the swarm a `--no-train` peer serves (training peers take the manifest's).
    #[arg(long, default_value = DEFAULT_RUN_NAME)]
    pub run_name: String,
    /// Run manifest (JSON). Default: RUN_DIR/manifest.json if there, else the default run
    /// on the embedded corpus (or --data).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Train until this many inner steps in total, then merge until the swarm is quiet.
    #[arg(long, conflicts_with = "duration")]
    pub steps: Option<u64>,
    /// Train for this many seconds, then merge until the swarm is quiet.
    #[arg(long, value_name = "SECS")]
    pub duration: Option<u64>,
    /// Train on this UTF-8 text file or directory instead of the embedded corpus (must be
    /// the corpus the manifest names).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// This peer's data shard `I/N` (default: from the peer id, N = 16).
    #[arg(long)]
    pub shard: Option<Shard>,
    /// CPU backend.
    #[arg(long, default_value = "flex")]
    pub backend: Backend,
    /// Write a checkpoint every this many steps.
    #[arg(long, default_value_t = 50)]
    pub checkpoint_every: u64,
    /// Upload cap on blob transfers in megabits per second.
    #[arg(long, value_name = "MBPS")]
    pub max_upload_mbps: Option<f64>,
    /// Do not discover peers on the local network by multicast DNS.
    #[arg(long)]
    pub no_mdns: bool,
    /// Serve as a circuit relay for peers behind NAT (with byte, time and reservation
    /// limits). Default: on for `--no-train` peers, off for training peers.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub relay_server: Option<bool>,
    /// Key file (default: RUN_DIR/peer_key); created if absent, so restarts keep the peer id.
    #[arg(long, value_name = "PATH")]
    pub key_file: Option<PathBuf>,
    /// Private swarm: a libp2p pre-shared key file (`/key/swarm/psk/1.0.0/`, `/base16/`,
    /// 64 hex digits). Only peers with the same key can connect; TCP only (QUIC cannot
    /// carry the key).
    #[arg(long, value_name = "FILE")]
    pub swarm_key: Option<PathBuf>,
    /// Testing only: refuse and disconnect the peers listed in RUN_DIR/blocked_peers (one
    /// peer id per line, re-read every second), so a test can partition live peers.
    #[arg(long, hide = true)]
    pub fault_injection: bool,
    /// What this peer runs: atoll (the default), or a synchronous baseline over the same
    /// network, for comparison: `dp` (data-parallel) or `diloco` (synchronous DiLoCo).
    #[arg(long, value_enum, default_value_t = Method::Atoll)]
    pub method: Method,
    /// With `--method dp|diloco`: peers in the group (all join before the first step).
    #[arg(long, default_value_t = 4)]
    pub group: usize,
    /// With `--method dp|diloco`: a member that misses a barrier is dropped (elastic)
    /// instead of stopping the run.
    #[arg(long)]
    pub elastic: bool,
    /// With `--method dp|diloco`: longest wait at a barrier, and for the group to form.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub barrier_timeout: u64,
    /// Serve a live status page (loss and val_bpb curves, peers, rounds, bytes) on this
    /// address, e.g. `127.0.0.1:8080` (port 0: any free port, named in status.json).
    #[arg(long = "http", value_name = "ADDR")]
    pub http: Option<std::net::SocketAddr>,
    /// Serve Prometheus metrics at `/metrics` on this address (port 0: any free port).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Emulate slower hardware: each inner step takes F times its compute time (the trainer
    /// idles for the rest, leaving the cores to others). F from 1 (full speed) to 1000.
    #[arg(long, value_name = "F", default_value = "1")]
    pub slowdown: node::Slowdown,
    /// Emulate a machine of its own: each inner step takes at least MS milliseconds (the
    /// trainer idles for the rest), so the step rate does not change when other processes
    /// on this machine start or die. Any method. At most 600000.
    #[arg(long, value_name = "MS")]
    pub min_step_ms: Option<u64>,
}

/// What an `atoll run` peer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Method {
    /// Decoupled DiLoCo, leaderless (this project).
    Atoll,
    /// Synchronous data-parallel: gradients averaged every inner step.
    Dp,
    /// Synchronous DiLoCo: outer deltas averaged every H steps at a barrier.
    Diloco,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Atoll => "atoll",
            Method::Dp => "dp",
            Method::Diloco => "diloco",
        }
    }
}

pub fn main(mut args: Args) -> anyhow::Result<()> {
    if let Some(mbps) = args.max_upload_mbps {
        if !(mbps.is_finite() && mbps > 0.0) {
            bail!("--max-upload-mbps must be a positive number, got {mbps}");
        }
    }
    if args.method != Method::Atoll && (args.http.is_some() || args.metrics_addr.is_some()) {
        bail!("--http and --metrics-addr serve atoll peers (training or --no-train), not --method dp|diloco");
    }
    if let Some(ms) = args.min_step_ms {
        args.slowdown = args.slowdown.with_floor(Duration::from_millis(ms))?;
    }
    if args.slowdown != node::Slowdown::NONE && args.no_train {
        bail!("--slowdown and --min-step-ms slow a training peer's inner steps; not --no-train");
    }
    if !args.no_train {
        // Before any tensor work: burn's kernels run on this pool (ARCHITECTURE, "CPU
        // priority").
        atoll::node::priority::lower_compute_pool();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    rt.block_on(join::prepare(&mut args))?;
    if args.no_train {
        rt.block_on(serve(args))
    } else if args.method != Method::Atoll {
        rt.block_on(sync_baseline(args))
    } else {
        rt.block_on(train(args))
    }
}

/// Peers banned in this run dir (one peer id per line, written by atoll-net).
pub const BAN_FILE_NAME: &str = "banned_peers";

fn net_config(args: &Args) -> anyhow::Result<NetConfig> {
    std::fs::create_dir_all(&args.run_dir)
        .with_context(|| format!("cannot create run dir {}", args.run_dir.display()))?;
    let key_path =
        args.key_file.clone().unwrap_or_else(|| args.run_dir.join(identity::KEY_FILE_NAME));
    let key = identity::load_or_create(&key_path)?;
    let mut cfg = NetConfig::new(key, args.run_name.clone());
    if let Some(path) = &args.swarm_key {
        let key = atoll_net::swarmkey::load(path)
            .with_context(|| format!("cannot use the swarm key {}", path.display()))?;
        cfg.swarm_key = Some(key);
    }
    cfg.listen = if !args.listen.is_empty() {
        args.listen.clone()
    } else if cfg.swarm_key.is_some() {
        vec!["/ip4/0.0.0.0/tcp/0".parse()?]
    } else {
        vec!["/ip4/0.0.0.0/tcp/0".parse()?, "/ip4/0.0.0.0/udp/0/quic-v1".parse()?]
    };
    // Peers banned for misbehaviour stay banned for the run, across restarts.
    cfg.ban_file = Some(args.run_dir.join(BAN_FILE_NAME));
    cfg.bootstrap = args.bootstrap.clone();
    cfg.mdns = !args.no_mdns;
    cfg.relay_server = args.relay_server.unwrap_or(args.no_train);
    cfg.max_upload_bytes_per_sec = args.max_upload_mbps.map(mbps_to_bytes_per_sec);
    if args.fault_injection {
        cfg.block_list = Some(args.run_dir.join(atoll_net::fault::FILE_NAME));
    }
    Ok(cfg)
}

/// The manifest of this peer: `--config`, else the run dir's, else the default run.
/// A run dir that already holds another manifest is refused with the difference.
fn resolve_manifest(args: &Args, corpus: &atoll::data::Corpus) -> anyhow::Result<Manifest> {
    let default = || {
        Manifest::new(&args.run_name, TrainConfig::default(), corpus, manifest::default_protocol())
    };
    Ok(known_manifest(args, Some(&default))?.unwrap_or_else(default))
}

/// The manifest of `--config` or of the run dir (else `default`'s, if given), checked
/// against the run dir's and saved there; `None` when there is none.
fn known_manifest(
    args: &Args,
    default: Option<&dyn Fn() -> Manifest>,
) -> anyhow::Result<Option<Manifest>> {
    let saved_path = args.run_dir.join(manifest::FILE_NAME);
    let saved = if saved_path.exists() { Some(Manifest::load(&saved_path)?) } else { None };
    let chosen = match (&args.config, &saved, default) {
        (Some(path), _, _) => Manifest::load(path)?,
        (None, Some(m), _) => m.clone(),
        (None, None, Some(default)) => default(),
        (None, None, None) => return Ok(None),
    };
    if let Some(saved) = saved {
        if saved != chosen {
            bail!(
                "{} holds the manifest of another run; use a fresh run dir. What differs \
                 (run dir ≠ given): {}",
                args.run_dir.display(),
                saved.diff(&chosen).join("; ")
            );
        }
    } else {
        atoll::checkpoint::write_atomic(&saved_path, &chosen.to_bytes())
            .with_context(|| format!("cannot write {}", saved_path.display()))?;
    }
    Ok(Some(chosen))
}

/// A training peer.
async fn train(args: Args) -> anyhow::Result<()> {
    let mut net = net_config(&args)?;
    let corpus = super::train::load_corpus(args.data.as_deref())?;
    let manifest = resolve_manifest(&args, &corpus)?;
    net.allow = manifest.allowed()?;
    if let Some(allow) = &net.allow {
        let me = atoll_net::PeerId::from(net.keypair.public());
        if !allow.contains(&me) {
            bail!(
                "this peer ({me}) is not on the run's allow list ({} peers): ask the run's \
                 owner to add it to the manifest's \"allow\", or use another --key-file",
                allow.len()
            );
        }
    }
    let shard = match args.shard {
        Some(s) => s,
        None => {
            let id = atoll_net::PeerId::from(net.keypair.public());
            let index = (node::proto_peer(&id).0 % u64::from(DEFAULT_SHARDS)) as u32;
            Shard { index, count: DEFAULT_SHARDS }
        }
    };
    let run_id = manifest.run_id();
    let (board, servers) = web::start(&args).await?;
    let opts = NodeOptions {
        manifest,
        corpus,
        run_dir: args.run_dir.clone(),
        shard,
        backend: args.backend,
        net,
        target_step: args.steps,
        duration: args.duration.map(Duration::from_secs),
        checkpoint_every: args.checkpoint_every,
        slowdown: args.slowdown,
        on_listening: Some(Box::new(move |peer, addrs| {
            println!("peer_id {peer}");
            for a in addrs {
                println!("listening {a}");
            }
            join::print_line(run_id, addrs);
        })),
        board,
    };
    let report = node::run(opts, shutdown_signal()).await;
    if let Some(s) = servers {
        s.shutdown().await;
    }
    let report = report?;
    println!(
        "finished at step {} ({} tokens); final val_bpb {:.3}; anchors {}",
        report.step,
        report.tokens,
        report.final_val_bpb,
        report.anchor_hashes.iter().map(|h| &h[..12.min(h.len())]).collect::<Vec<_>>().join(" ")
    );
    Ok(())
}

/// A peer of a synchronous baseline (`--method dp|diloco`).
async fn sync_baseline(args: Args) -> anyhow::Result<()> {
    use atoll::baseline::networked::{self, SyncPeer};
    use atoll::baseline::BaselineError;
    use atoll::collective::CollectiveError;
    let net = net_config(&args)?;
    let corpus = super::train::load_corpus(args.data.as_deref())?;
    let manifest = resolve_manifest(&args, &corpus)?;
    let shard = args.shard.context("--method dp|diloco needs --shard I/N")?;
    let (steps, duration) = match (args.steps, args.duration) {
        (Some(steps), _) => (steps, None),
        (None, Some(secs)) => (u64::MAX, Some(Duration::from_secs(secs))),
        (None, None) => bail!("--method dp|diloco needs --steps or --duration"),
    };
    let method = match args.method {
        Method::Dp => networked::Method::DataParallel,
        _ => networked::Method::Diloco,
    };
    let peer = SyncPeer {
        manifest,
        corpus,
        run_dir: args.run_dir.clone(),
        shard,
        backend: args.backend,
        net,
        method,
        peers: args.group.max(1),
        steps,
        duration,
        elastic: args.elastic,
        timeout: Duration::from_secs(args.barrier_timeout.max(1)),
        slowdown: args.slowdown,
    };
    let report = match networked::run(peer).await {
        Err(BaselineError::Collective(CollectiveError::Evicted { step })) => {
            // Elastic groups only shrink: a member the others went on without leaves.
            println!(
                "left behind by the group at step {step} (it went on without this peer); stopped"
            );
            return Ok(());
        }
        other => other?,
    };
    println!(
        "finished at step {} ({} tokens); final val_bpb {:.3}",
        report.step, report.tokens, report.final_val_bpb
    );
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
    tracing::info!("stop requested; leaving at the next step boundary");
}

/// A bootstrap/relay peer: no training.
async fn serve(args: Args) -> anyhow::Result<()> {
    let mut cfg = net_config(&args)?;
    // With a manifest (--config, --join or the run dir's) it serves that run by its name,
    // and the manifest to joiners; without, the swarm named by --run-name.
    let manifest = known_manifest(&args, None)?;
    if let Some(m) = &manifest {
        cfg.run_name = m.name.clone();
        cfg.manifest = Some(atoll_net::BlobHash(m.run_id().0));
    }
    let mut node = Node::start(cfg).await.context("cannot start the peer")?;
    println!("peer_id {}", node.client.peer_id());
    for a in &node.listen_addrs {
        println!("listening {a}");
    }
    if let Some(m) = &manifest {
        node.client.put_blob(m.to_bytes().into())?;
        join::print_line(m.run_id(), &node.listen_addrs);
    }
    let (board, servers) = web::start(&args).await?;
    // Heartbeats, the swarm table, status.json and swarm.json, as a training peer has.
    let served = node::serve_without_training(
        node.client.clone(),
        &mut node.events,
        args.run_dir.clone(),
        board,
        shutdown_signal(),
        log_event,
    )
    .await;
    tracing::info!("stopping");
    if let Some(s) = servers {
        s.shutdown().await;
    }
    node.handle.shutdown().await?;
    served?;
    Ok(())
}

fn log_event(event: &NetEvent) {
    match event {
        NetEvent::RunPeerJoined(p) => tracing::debug!(peer = %p, "run peer joined"),
        NetEvent::Heartbeat { author, .. } => tracing::trace!(peer = %author, "heartbeat"),
        NetEvent::RunPeerLeft(p) => tracing::debug!(peer = %p, "run peer left"),
        NetEvent::PeerIdentified { peer, manifest } => {
            tracing::debug!(%peer, manifest = ?manifest, "peer identified")
        }
        NetEvent::Announcement { from, payload, .. } => {
            tracing::debug!(from = %from, bytes = payload.len(), "announcement")
        }
        other => tracing::info!(event = ?other, "network event"),
    }
}
