//! `atoll run --join RUN_ID@MULTIADDR`: the run's manifest fetched by its id into the run
//! dir before the peer starts (see [`atoll::join`]), and the `--join` line a peer prints
//! for others.

use anyhow::{bail, Context};
use atoll::join::{self, JoinTarget};
use atoll::manifest::{self, Manifest, RunId};
use atoll_net::Multiaddr;

use super::Args;

/// With `--join`: RUN_DIR/manifest.json holds the run's manifest (fetched unless the run
/// dir holds it already: a restart needs no peer for it), and the peer named is the first
/// bootstrap address. Without, nothing.
pub async fn prepare(args: &mut Args) -> anyhow::Result<()> {
    let Some(target) = args.join.clone() else { return Ok(()) };
    std::fs::create_dir_all(&args.run_dir)
        .with_context(|| format!("cannot create run dir {}", args.run_dir.display()))?;
    let path = args.run_dir.join(manifest::FILE_NAME);
    if path.exists() {
        let saved = Manifest::load(&path)?;
        if saved.run_id() != target.run {
            bail!(
                "{} holds the manifest of run {}, not of run {} that --join names: use a \
                 fresh run dir",
                args.run_dir.display(),
                saved.run_id().hex(),
                target.run.hex()
            );
        }
        println!("run {} ({}): manifest already in {}", saved.name, target.run, path.display());
    } else {
        println!("fetching the manifest of run {} from {}", target.run, target.addr);
        // Other bootstrap peers may serve it too (tried at once; the first to answer wins).
        let mut targets = vec![target.clone()];
        for addr in &args.bootstrap {
            if let Some(t) = target_of(target.run, addr).filter(|t| !targets.contains(t)) {
                targets.push(t);
            }
        }
        let cfg = super::net_config(args)?;
        let m = join::fetch_manifest(cfg, target.run, &targets, join::JOIN_TIMEOUT).await?;
        atoll::checkpoint::write_atomic(&path, &m.to_bytes())
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("joined run {} ({}): manifest saved to {}", m.name, target.run, path.display());
    }
    if !args.bootstrap.contains(&target.addr) {
        args.bootstrap.insert(0, target.addr);
    }
    Ok(())
}

/// A bootstrap address as a join target, if it names its peer.
fn target_of(run: RunId, addr: &Multiaddr) -> Option<JoinTarget> {
    match addr.iter().last()? {
        atoll_net::multiaddr::Protocol::P2p(peer) => {
            Some(JoinTarget { run, addr: addr.clone(), peer })
        }
        _ => None,
    }
}

/// Prints the line others run to join through this peer.
pub fn print_line(run: RunId, listen: &[Multiaddr]) {
    if let Some(line) = join::join_line(run, listen) {
        println!("others join with: {line}");
    }
}
