//! The arguments of `atoll run` (clap) and the method a peer runs.

use std::path::PathBuf;

use atoll::backend::Backend;
use atoll::data::Shard;
use atoll::node;
use atoll_net::{Multiaddr, DEFAULT_RUN_NAME};

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
    /// Model size of a new default run (a manifest from --config, --join or the run dir
    /// names its own model).
    #[arg(long, value_enum, conflicts_with_all = ["config", "join"])]
    pub model: Option<atoll::train::preset::Preset>,
    /// Feed-forward activation of a new default run (`atoll train --activation`).
    /// Default: the preset's.
    #[arg(long, value_enum, conflicts_with_all = ["config", "join"])]
    pub activation: Option<atoll::model::Activation>,
    /// Inner optimizer of a new default run's weight matrices (`atoll train --optimizer`).
    /// Default: the preset's.
    #[arg(long, value_enum, conflicts_with_all = ["config", "join"])]
    pub optimizer: Option<atoll::train::InnerOptimizer>,
    /// Train until this many inner steps in total, then merge until the swarm is quiet.
    #[arg(long, conflicts_with_all = ["duration", "no_train"])]
    pub steps: Option<u64>,
    /// Train for this many seconds, then merge until the swarm is quiet (with --no-train:
    /// serve this long, then stop; without, until stopped).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<u64>,
    /// Train on this text file, JSONL file (`*.jsonl`, one `{"text": …}` per line) or
    /// directory of them instead of the embedded corpus (read from disk as it trains).
    /// It must be the corpus the manifest names.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// This peer's data shard `I/N` (default: from the peer id, N = 16).
    #[arg(long)]
    pub shard: Option<Shard>,
    /// CPU backend.
    #[arg(long, default_value = "flex")]
    pub backend: Backend,
    /// Run each step's batch in passes of at most ROWS rows, their gradients summed
    /// before the one optimizer step: the same step, with one pass's activations in
    /// memory. A choice of this peer, not of the run. Default: the whole batch, or the
    /// most rows that fit this machine's available memory.
    #[arg(long, value_name = "ROWS", value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub micro_batch: Option<u64>,
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
