//! `atoll run`: start a peer of a run's swarm and keep `RUN_DIR/status.json` current.
//!
//! A training peer (the default) trains its shard and merges with the swarm (see
//! [`atoll::node`]); `--no-train` starts a bootstrap/relay peer that serves the DHT, gossip
//! and blobs without training.

mod args;
mod join;
mod web;

pub use args::{Args, Method};

use std::time::Duration;

use anyhow::{bail, Context};
use atoll::data::Shard;
use atoll::manifest::{self, Manifest};
use atoll::node::{self, NodeOptions};
use atoll::train::TrainConfig;
use atoll_net::limiter::mbps_to_bytes_per_sec;
use atoll_net::{identity, NetConfig, NetEvent, Node};

/// Shards of the data when `--shard` is not given: a peer takes the one its peer id hashes
/// to, so restarts keep their shard.
const DEFAULT_SHARDS: u32 = 16;

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
    let preset = args.model.unwrap_or_default();
    let mut train = preset.train_config(TrainConfig::default().seed);
    train.model.activation = args.activation.unwrap_or(train.model.activation);
    train.optimizer = args.optimizer.unwrap_or(train.optimizer);
    let protocol = manifest::preset_protocol(preset, train.optimizer);
    let default = || Manifest::new(&args.run_name, train.clone(), corpus, protocol.clone());
    let manifest = known_manifest(args, Some(&default))?.unwrap_or_else(default);
    let name = |v: Option<clap::builder::PossibleValue>| {
        v.map_or_else(String::new, |v| v.get_name().to_owned())
    };
    let mut chosen = Vec::new();
    if let Some(p) = args.model {
        chosen.push(format!("--model {}", name(clap::ValueEnum::to_possible_value(&p))));
    }
    if let Some(a) = args.activation {
        chosen.push(format!("--activation {}", name(clap::ValueEnum::to_possible_value(&a))));
    }
    if let Some(o) = args.optimizer {
        chosen.push(format!("--optimizer {}", name(clap::ValueEnum::to_possible_value(&o))));
    }
    let other = manifest.train.model != train.model
        || args.optimizer.is_some_and(|o| o != manifest.train.optimizer);
    if !chosen.is_empty() && other {
        bail!(
            "{} holds a run of another model ({} parameters, {:?}, {:?}); {} {} to a new run \
             only: use a fresh run dir",
            args.run_dir.display(),
            manifest.train.model.num_params(),
            manifest.train.model.activation,
            manifest.train.optimizer,
            chosen.join(" and "),
            if chosen.len() > 1 { "apply" } else { "applies" },
        );
    }
    Ok(manifest)
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
    let micro_batch = atoll::train::preset::check_machine(&manifest.train, 1, args.micro_batch)?;
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
        micro_batch,
        run_dir: args.run_dir.clone(),
        shard,
        backend: args.backend,
        net,
        target_step: args.steps,
        duration: args.duration.map(Duration::from_secs),
        checkpoint_every: args.checkpoint_every,
        slowdown: args.slowdown,
        clock: node::Clock::System,
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
    let duration = args.duration.map(Duration::from_secs);
    let stop = async move {
        match duration {
            Some(d) => tokio::select! {
                () = shutdown_signal() => {}
                () = tokio::time::sleep(d) => {}
            },
            None => shutdown_signal().await,
        }
    };
    // Heartbeats, the swarm table, status.json and swarm.json, as a training peer has.
    let served = node::serve_without_training(
        node.client.clone(),
        &mut node.events,
        args.run_dir.clone(),
        board,
        stop,
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
