//! Swarms of test peers: started together, awaited together, compared at the end.

use std::path::Path;
use std::time::{Duration, Instant};

use atoll::rundir::status::TrainingStatus;

use super::{swarm_manifest, Peer, Spec, Until};

/// A swarm of training peers in `root/peer-I` (one per entry of `until`), peer 0 first and
/// the others bootstrapping from it; `adjust` may change peer `I`'s spec.
pub fn swarm_with(
    root: &Path,
    name: &str,
    until: &[Until],
    adjust: impl Fn(usize, Spec) -> Spec,
) -> Vec<Peer> {
    swarm_of(root, &swarm_manifest(root, name), until, adjust)
}

/// [`swarm_with`] on a manifest of the caller's (a file).
pub fn swarm_of(
    root: &Path,
    manifest: &Path,
    until: &[Until],
    adjust: impl Fn(usize, Spec) -> Spec,
) -> Vec<Peer> {
    let n = until.len();
    let spec = |i: usize| {
        let dir = root.join(format!("peer-{i}"));
        adjust(i, Spec::train(dir, manifest, &format!("{i}/{n}"), until[i]))
    };
    let mut peers = vec![Peer::start("peer 0", spec(0))];
    let addr = peers[0].listen_addr(Duration::from_secs(30));
    for i in 1..n {
        peers.push(Peer::start(&format!("peer {i}"), spec(i).bootstrap(Some(addr.clone()))));
    }
    peers
}

/// [`swarm_with`] on loopback with default specs, each peer training to its entry of
/// `steps`.
pub fn swarm(root: &Path, name: &str, steps: &[u64]) -> Vec<Peer> {
    let until: Vec<Until> = steps.iter().map(|&n| Until::Steps(n)).collect();
    swarm_with(root, name, &until, |_, s| s)
}

/// Waits for every peer to finish on its own and checks that all exited 0.
pub fn wait_all_exit(peers: &mut [Peer], within: Duration) {
    let deadline = Instant::now() + within;
    for p in peers.iter_mut() {
        let left = deadline.saturating_duration_since(Instant::now());
        let exit = p.wait_exit(left);
        assert!(exit.success(), "{} exited with {exit}\n{}", p.name, p.log_tail());
    }
}

/// Final status of every peer: stopped, trained to its target, all with the same anchors.
pub fn assert_same_final_anchors(peers: &[Peer]) {
    let finals: Vec<TrainingStatus> = peers
        .iter()
        .map(|p| {
            let s = p.status().unwrap_or_else(|| panic!("{} left no status", p.name));
            assert!(!s.running, "{} says it is running after exiting", p.name);
            s.training.unwrap()
        })
        .collect();
    for (p, t) in peers.iter().zip(&finals) {
        if let Some(steps) = p.spec.steps() {
            assert_eq!(t.step, steps, "{} ended at step {}", p.name, t.step);
        }
        assert!(t.final_val_bpb.is_some(), "{} has no final evaluation", p.name);
        assert_eq!(t.anchor_hashes.len(), 4, "{}", p.name);
    }
    for (p, t) in peers.iter().zip(&finals).skip(1) {
        assert_eq!(
            t.anchor_hashes,
            finals[0].anchor_hashes,
            "{} ended with other anchors than peer 0 (rounds {:?} vs {:?})\n{}\n{}",
            p.name,
            t.round,
            finals[0].round,
            p.log_tail(),
            peers[0].log_tail()
        );
    }
}
