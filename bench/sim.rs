//! Simulator ablations (DESIGN.md §2.4, §2.5, issue 4): each row is one simulated run of
//! the real protocol core on the noisy-quadratic stand-in; "loss" is the mean global loss
//! of the peers' anchors at the end (lower is better), "B/peer/round" the payload bytes
//! each peer received per fragment round.
//!
//! `cargo bench --bench sim -- [--peers N] [--cycles C] [--seeds S] [--momentum-grid]`
//!
//! `--momentum-grid` instead prints final loss over inner lr × outer μ × merge lag.
//!
//! `--sampling [--sizes 16,64,256,1000] [--contributors 16] [--momentum μ] [--sampled-only]
//! [--expected]` instead prints traffic, quality and cost against the swarm's size, every
//! peer contributing every round (the all-to-all exchange) beside sampled contributions
//! (`proto::sampling`). `--expected` gives sampled runs the swarm's size in the manifest
//! (`expected_peers`), so round 1 is sampled too.
//!
//! `--vote-minority [--sybils 5] [--peers 8] [--cycles 12] [--seeds 12] [--unserved]` instead
//! runs a credited minority of voters against states nobody can recompute, at merge lags 0
//! (strict states on and off) and 1 (issue 21; bench/RESULTS.md, "A credited minority's
//! unverifiable state", "Strict states"). The forged state names a made-up parent, or with
//! `--unserved` the honest parent and deltas nobody holds.

use atoll::delta::Codec;
use atoll::proto::MergeRule;
use atoll::sim::byzantine::{Attack, Forgery};
use atoll::sim::{Sim, SimConfig};
use std::time::Instant;

struct Row {
    name: &'static str,
    tweak: fn(&mut SimConfig),
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1));
    let peers: usize = value("--peers").and_then(|s| s.parse().ok()).unwrap_or(16);
    let cycles: u64 = value("--cycles").and_then(|s| s.parse().ok()).unwrap_or(40);
    let seeds: u64 = value("--seeds").and_then(|s| s.parse().ok()).unwrap_or(5);
    if args.iter().any(|a| a == "--momentum-grid") {
        return momentum_grid(peers, cycles, seeds);
    }
    if args.iter().any(|a| a == "--vote-minority") {
        let sybils = value("--sybils").and_then(|s| s.parse().ok()).unwrap_or(5);
        let peers = value("--peers").and_then(|s| s.parse().ok()).unwrap_or(8);
        let cycles = value("--cycles").and_then(|s| s.parse().ok()).unwrap_or(12);
        let seeds = value("--seeds").and_then(|s| s.parse().ok()).unwrap_or(12);
        let forged = if args.iter().any(|a| a == "--unserved") {
            Forgery::UnservedLog
        } else {
            Forgery::ForgedLog
        };
        return vote_minority(peers, sybils, forged, cycles, seeds);
    }
    if args.iter().any(|a| a == "--sampling") {
        let sizes: Vec<usize> = value("--sizes")
            .map(|s| s.split(',').filter_map(|n| n.parse().ok()).collect())
            .unwrap_or_else(|| vec![16, 64, 256, 1000]);
        let target = value("--contributors").and_then(|s| s.parse().ok()).unwrap_or(16);
        let momentum = value("--momentum").and_then(|s| s.parse().ok());
        let exchanges =
            if args.iter().any(|a| a == "--sampled-only") { vec![target] } else { vec![0, target] };
        let expected = args.iter().any(|a| a == "--expected");
        return sampling(&sizes, &exchanges, momentum, expected, cycles, seeds);
    }
    let rows = [
        Row { name: "K=1 lag 0, heterogeneous, grace (γ=0.5)", tweak: SimConfig::heterogeneous },
        Row {
            name: "K=1 lag 0, heterogeneous, no grace (γ=0)",
            tweak: |c| {
                c.heterogeneous();
                c.settings.gamma = 0.0;
            },
        },
        Row {
            name: "K=1 lag 1, heterogeneous, grace (γ=0.5)",
            tweak: |c| {
                c.heterogeneous();
                c.settings.merge_lag = 1;
            },
        },
        Row {
            name: "K=1 lag 1, heterogeneous, no grace (γ=0)",
            tweak: |c| {
                c.heterogeneous();
                c.settings.merge_lag = 1;
                c.settings.gamma = 0.0;
            },
        },
        Row { name: "4-bit deltas (default)", tweak: |_| {} },
        Row { name: "8-bit deltas", tweak: |c| c.settings.encode.codec = Codec::Q8 },
        Row { name: "f32 deltas", tweak: |c| c.settings.encode.codec = Codec::F32 },
        Row { name: "RDA (default)", tweak: |_| {} },
        Row { name: "plain weighted mean", tweak: |c| c.settings.merge = MergeRule::Mean },
    ];
    println!("{peers} peers, {cycles} cycles, mean over {seeds} seeds (seed = 1..={seeds})");
    println!("| run | final loss | consensus distance | adoptions/peer | late share | B/peer/round | wall s |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let (mut loss, mut dist, mut adopt, mut late, mut bytes, mut wall) =
            (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        for seed in 1..=seeds {
            let mut cfg = SimConfig::new(peers, seed);
            cfg.track_lineage = false;
            (row.tweak)(&mut cfg);
            let t = Instant::now();
            let mut sim = Sim::new(cfg).unwrap_or_else(|e| panic!("{e}"));
            sim.run_cycles(cycles);
            wall += t.elapsed().as_secs_f64();
            loss += sim.mean_anchor_loss();
            dist += sim.consensus_distance();
            adopt += sim.stats.adoptions as f64 / peers as f64;
            late += sim.stats.late_merged as f64 / sim.stats.merged_contributions.max(1) as f64;
            bytes += sim.payload_bytes_per_peer_round();
        }
        let n = seeds as f64;
        println!(
            "| {} | {:.4} | {:.1e} | {:.1} | {:.2} | {:.0} | {:.2} |",
            row.name,
            loss / n,
            dist / n,
            adopt / n,
            late / n,
            bytes / n,
            wall / n
        );
    }
}

/// Outer momentum against merge lag: staleness and momentum interact.
fn momentum_grid(peers: usize, cycles: u64, seeds: u64) {
    println!("{peers} peers, {cycles} cycles, mean over {seeds} seeds");
    println!("| inner lr | μ | loss lag 0 | loss lag 1 |");
    println!("|---:|---:|---:|---:|");
    for lr in [0.01f32, 0.003] {
        for mu in [0.3f32, 0.5, 0.7, 0.9] {
            let loss = |lag: u64| {
                let mut total = 0.0;
                for seed in 1..=seeds {
                    let mut cfg = SimConfig::new(peers, seed);
                    cfg.settings.merge_lag = lag;
                    cfg.settings.momentum = mu;
                    cfg.inner_lr = lr;
                    cfg.track_lineage = false;
                    let mut sim = Sim::new(cfg).unwrap_or_else(|e| panic!("{e}"));
                    sim.run_cycles(cycles);
                    total += sim.mean_anchor_loss();
                }
                total / seeds as f64
            };
            println!("| {lr} | {mu} | {:.4} | {:.4} |", loss(0), loss(1));
        }
    }
}

/// Traffic and quality against the swarm's size: all-to-all against sampled contributions.
/// The model and network are `simulator::scale`'s (one fragment of 16 values, fast uplinks), so
/// the cost is the protocol's per-message work; loss is the quadratic's, as elsewhere here.
fn sampling(
    sizes: &[usize],
    exchanges: &[usize],
    momentum: Option<f32>,
    expected: bool,
    cycles: u64,
    seeds: u64,
) {
    println!("{cycles} cycles, mean over {seeds} seeds; contributors = 0 is all-to-all");
    println!("| peers | contributors | final loss | agree | adoptions/peer/cycle | deltas merged/round | B/peer/round | events | wall s |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &peers in sizes {
        for &contributors in exchanges {
            let (mut loss, mut agree, mut adopt, mut merged, mut bytes, mut events, mut wall) =
                (0.0, 0, 0.0, 0.0, 0.0, 0u64, 0.0);
            for seed in 1..=seeds {
                let mut cfg = SimConfig::new(peers, seed).tiny_and_fast();
                cfg.track_lineage = false;
                cfg.settings.contributors = contributors;
                if expected && contributors > 0 {
                    cfg.settings.expected_peers = peers;
                }
                if let Some(mu) = momentum {
                    cfg.settings.momentum = mu;
                }
                let t = Instant::now();
                let mut sim = Sim::new(cfg).unwrap_or_else(|e| panic!("{e}"));
                sim.run_cycles(cycles);
                wall += t.elapsed().as_secs_f64();
                loss += sim.mean_anchor_loss();
                agree += usize::from(sim.agree());
                adopt += sim.stats.adoptions as f64 / peers as f64 / cycles as f64;
                merged += sim.stats.merged_contributions as f64 / sim.stats.merges.max(1) as f64;
                bytes += sim.payload_bytes_per_peer_round();
                events += sim.stats.events;
            }
            let n = seeds as f64;
            println!(
                "| {peers} | {contributors} | {:.4} | {agree}/{seeds} | {:.2} | {:.1} | {:.0} | {} | {:.2} |",
                loss / n,
                adopt / n,
                merged / n,
                bytes / n,
                events / seeds,
                wall / n
            );
        }
    }
}

/// One attacker (peer 0) and `sybils` Sybils that earn vote credit with copies of its
/// deltas vote, after each of its merges, for a poisoned state with a made-up log, which no
/// honest peer can recompute. With `sybils` + 1 below the honest peers' count they are a
/// minority of the credited voters. Per merge lag: the adoptions of states of no known
/// lineage by honest peers, and the honest anchors' loss against the same seeds unattacked.
fn vote_minority(peers: usize, sybils: usize, forged: Forgery, cycles: u64, seeds: u64) {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1));
    // A lossy network (`--loss P`, each gossip message on `--gossip-paths K` paths) splits
    // the honest peers into lineages of their own, where the tie between lineages decides;
    // `--no-weigh`: trainers that do not weigh states (what weighing prevents).
    let loss: f64 = value("--loss").and_then(|s| s.parse().ok()).unwrap_or(0.0);
    let paths: i32 = value("--gossip-paths").and_then(|s| s.parse().ok()).unwrap_or(3);
    let weigh = !args.iter().any(|a| a == "--no-weigh");
    let honest = peers - 1;
    println!(
        "{honest} honest peers, 1 attacker + {sybils} Sybils ({forged:?}), {cycles} cycles, seeds 1..={seeds}, loss {loss} on {paths} gossip paths, weighing {weigh}"
    );
    println!("| merge lag | strict states | forged adoptions (all seeds) | seeds with one | honest loss, attacked (median) | unattacked (median) | weighed worse / weighed, attacked | unattacked |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    for (lag, strict) in [(0, true), (0, false), (1, true)] {
        let run = |seed: u64, hostile: bool| {
            let mut cfg = SimConfig::new(peers, seed);
            cfg.settings.merge_lag = lag;
            cfg.settings.strict_states = strict;
            (cfg.net.loss, cfg.net.gossip_paths, cfg.weigh_states) = (loss, paths, weigh);
            if hostile {
                cfg.hostile = vec![(0, Attack::VoteTakeover { sybils, forged, earn_credit: true })];
            }
            let mut sim = Sim::new(cfg).unwrap_or_else(|e| panic!("{e}"));
            sim.run_cycles(cycles);
            let weighed = (sim.stats.weighed, sim.stats.weighed_worse);
            (sim.stats.unknown_lineage, sim.honest_anchor_loss(), weighed)
        };
        let (mut adopted, mut hit, mut attacked, mut clean) = (0, 0, Vec::new(), Vec::new());
        let (mut weighed, mut worse) = ([0; 2], [0; 2]);
        for seed in 1..=seeds {
            let (forged, loss, (w, bad)) = run(seed, true);
            adopted += forged;
            hit += usize::from(forged > 0);
            attacked.push(loss);
            (weighed[0], worse[0]) = (weighed[0] + w, worse[0] + bad);
            let (_, loss, (w, bad)) = run(seed, false);
            clean.push(loss);
            (weighed[1], worse[1]) = (weighed[1] + w, worse[1] + bad);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "| {lag} | {strict} | {adopted} | {hit}/{seeds} | {:.3e} | {:.3e} | {}/{} | {}/{} |",
            median(&mut attacked),
            median(&mut clean),
            worse[0],
            weighed[0],
            worse[1],
            weighed[1]
        );
    }
}
