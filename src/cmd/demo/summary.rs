//! The end of `atoll demo`: every peer's `status.json` read into `summary.json`, and the
//! table printed after the run.

use std::path::Path;

use anyhow::Context;
use atoll::backend::Backend;
use atoll::manifest::Manifest;
use atoll::rundir::status::{self, StatusFile};
use serde::Serialize;

use super::super::swarm;
use super::Args;

/// One peer in `summary.json`.
#[derive(Debug, Serialize)]
pub struct PeerSummary {
    pub peer_id: String,
    pub final_val_loss: Option<f64>,
    pub final_val_bpb: Option<f64>,
    pub tokens: u64,
    pub steps: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub anchor_hashes: Vec<String>,
    /// Its `--slowdown` factor (1: full speed).
    pub slowdown: f64,
    /// Seconds after the first peer it started (0 but for `--late-peers`).
    pub started_after_s: u64,
    /// The backend it trained on.
    pub backend: Backend,
}

/// `summary.json`.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub peers: Vec<PeerSummary>,
    /// Mean over fragments of the peers' relative spread around the mean anchor (0 = equal).
    pub consensus_distance: f64,
    /// Every peer ended with the same anchor hash for every fragment.
    pub anchors_agree: bool,
    pub mean_final_val_bpb: Option<f64>,
    pub wall_s: f64,
    pub param_count: usize,
    /// Most inner steps one peer took.
    pub steps: u64,
    /// What synchronous data-parallel would send per peer for the same steps
    /// (2 × parameters × 4 bytes per step), and the ratio to what a peer sent.
    pub data_parallel_bytes_per_peer: u64,
    pub bytes_ratio_vs_data_parallel: f64,
    /// Inner steps per period of a fragment (the busiest peer's steps over its mean round):
    /// the manifest assumes `h`; rounds are wall-clock, so a machine that steps more slowly
    /// merges after fewer steps, and each step costs more bytes.
    pub steps_per_period: f64,
    /// The manifest's `h`.
    pub h: u64,
    pub run_id: String,
}

/// Reads every peer's `status.json` (in `dirs`, by peer index) into the summary.
pub(super) fn summarise(
    args: &Args,
    manifest: &Manifest,
    dirs: &[&Path],
    wall_s: f64,
) -> anyhow::Result<Summary> {
    let mut out = Vec::new();
    let mut param_count = 0;
    let mut steps_per_period = 0.0f64;
    for (i, dir) in dirs.iter().enumerate() {
        let path = dir.join(status::FILE_NAME);
        let s: StatusFile =
            status::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let t = s.training.clone().unwrap_or_default();
        param_count = t.param_count;
        // Its mean fragment round at the end: the periods it took part in.
        let rounds = t.round.iter().sum::<u64>() as f64 / t.round.len().max(1) as f64;
        if rounds > 0.0 {
            steps_per_period = steps_per_period.max(t.step as f64 / rounds);
        }
        out.push(PeerSummary {
            peer_id: s.stats.peer_id.clone(),
            final_val_loss: t.final_val_loss,
            final_val_bpb: t.final_val_bpb,
            tokens: t.tokens,
            steps: t.step,
            bytes_sent: s.stats.bytes_sent,
            bytes_received: s.stats.bytes_received,
            anchor_hashes: t.anchor_hashes,
            slowdown: if args.slowed(i as u32) { args.slowdown.factor() } else { 1.0 },
            started_after_s: args.start_after(i as u32),
            backend: args.backend(i as u32),
        });
    }
    let anchors_agree = out.windows(2).all(|w| w[0].anchor_hashes == w[1].anchor_hashes);
    let bpbs: Vec<f64> = out.iter().filter_map(|p| p.final_val_bpb).collect();
    let mean_final_val_bpb = (bpbs.len() == out.len() && !bpbs.is_empty())
        .then(|| bpbs.iter().sum::<f64>() / bpbs.len() as f64);
    let steps = out.iter().map(|p| p.steps).max().unwrap_or(0);
    let dp = 2 * param_count as u64 * 4 * steps;
    let max_sent = out.iter().map(|p| p.bytes_sent).max().unwrap_or(0).max(1);
    Ok(Summary {
        consensus_distance: swarm::consensus(manifest, dirs.iter().copied())?,
        anchors_agree,
        mean_final_val_bpb,
        wall_s,
        param_count,
        steps,
        data_parallel_bytes_per_peer: dp,
        bytes_ratio_vs_data_parallel: dp as f64 / max_sent as f64,
        steps_per_period,
        h: manifest.protocol.h,
        run_id: manifest.run_id().short(),
        peers: out,
    })
}

/// The summary table and the swarm's lines, on stdout.
pub(super) fn print(s: &Summary) {
    println!();
    println!(
        "{:<6} {:<54} {:<8} {:>9} {:>10} {:>11} {:>11}",
        "peer", "peer id", "backend", "val_bpb", "tokens", "sent", "received"
    );
    for (i, p) in s.peers.iter().enumerate() {
        let bpb = p.final_val_bpb.map_or("-".into(), |v| format!("{v:.3}"));
        println!(
            "{:<6} {:<54} {:<8} {:>9} {:>10} {:>11} {:>11}",
            i,
            p.peer_id,
            p.backend.name(),
            bpb,
            p.tokens,
            super::super::status::bytes(p.bytes_sent),
            super::super::status::bytes(p.bytes_received)
        );
    }
    let mean = s.mean_final_val_bpb.map_or("-".into(), |v| format!("{v:.3}"));
    println!(
        "swarm: mean final val_bpb {mean}; anchors {}; consensus distance {:.2e}; {:.0} s; {} parameters",
        if s.anchors_agree { "identical" } else { "DIFFER" },
        s.consensus_distance,
        s.wall_s,
        s.param_count
    );
    println!(
        "bytes: at most {} sent per peer vs {} for synchronous data-parallel ({:.0}× less)",
        super::super::status::bytes(s.peers.iter().map(|p| p.bytes_sent).max().unwrap_or(0)),
        super::super::status::bytes(s.data_parallel_bytes_per_peer),
        s.bytes_ratio_vs_data_parallel
    );
    if s.steps_per_period > 0.0 {
        println!(
            "pace: {:.1} inner steps per period (the run assumes {}; periods are wall-clock, \
             so slower steps mean fewer per merge and more bytes per step)",
            s.steps_per_period, s.h
        );
    }
}
