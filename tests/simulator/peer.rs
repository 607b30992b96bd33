//! The shipped peer's life around training, at swarm scale in the simulator (issue 20):
//! a fresh peer that joins a running swarm trains only from the swarm's anchors, and peers
//! with a step target merge on until the swarm is quiet, then finish alike. The decisions
//! are `atoll::peer::Peer`'s — the node runs the same type. `SEED=n` replays a failure.

use atoll::peer::QUIET_MIN_MS;
use atoll::proto::RawSettings;
use atoll::sim::{seed_from_env, Sim, SimConfig};

/// A fresh peer joining 119 others after six cycles is held until it holds the swarm's
/// states — no inner step on the initial weights, whose delta would pull the swarm back —
/// and is released by catching up, not by its wait running out; then it agrees.
#[test]
fn a_fresh_joiner_trains_only_from_the_swarms_anchors() {
    let seed = seed_from_env(91);
    let cfg = SimConfig::new(120, seed);
    let period = cfg.settings.h * cfg.settings.step_ms;
    let mut sim = Sim::new(cfg).unwrap();
    let joiner = 119;
    sim.crash(joiner);
    sim.run_cycles(6);
    let joined = sim.now();
    sim.join_fresh(joiner).unwrap();
    sim.run_cycles(3);
    let (at, why, steps) =
        sim.life(joiner).released.clone().expect("the joiner was never released");
    assert!(why.caught_up && why.heard_any, "released without the swarm's states: {why:?}");
    assert_eq!(steps, 0, "the joiner trained before it held the swarm's anchors");
    assert!(at < joined + 2 * period, "released at {at}, joined at {joined}: its wait ran out");
    assert!(why.rounds.iter().all(|&r| r >= 5), "released holding rounds {:?}", why.rounds);
    sim.run_cycles(2);
    assert!(sim.agree(), "the joiner does not agree with the swarm");
}

/// 100 peers of mixed speeds with a step target: the fast ones keep merging the slow
/// ones' deltas, and every peer finishes only once nothing changed for the quiet time —
/// all of them with the same final anchors.
#[test]
fn trained_peers_merge_on_until_the_swarm_is_quiet_then_finish_alike() {
    let seed = seed_from_env(92);
    let mut cfg = SimConfig::new(100, seed);
    cfg.track_lineage = false;
    cfg.step_target = Some(5 * cfg.settings.h);
    let period = cfg.settings.h * cfg.settings.step_ms;
    let mut sim = Sim::new(cfg).unwrap();
    let all_finished = |s: &Sim| (0..s.peers()).all(|i| s.life(i).finished.is_some());
    for _ in 0..30 {
        if all_finished(&sim) {
            break;
        }
        sim.run_cycles(1);
    }
    assert!(all_finished(&sim), "not every peer finished within 30 cycles");
    let trained_last = (0..sim.peers()).filter_map(|i| sim.life(i).trained_at).max().unwrap();
    let mut finals = Vec::new();
    for i in 0..sim.peers() {
        let life = sim.life(i);
        let trained = life.trained_at.expect("finished without being trained");
        let (finished, anchors) = life.finished.clone().unwrap();
        // Not before its own quiet time, nor before the last trainer stopped plus a period
        // (the slowest peer's last delta still had to be merged).
        assert!(finished > trained + QUIET_MIN_MS, "peer {i} finished {finished} ms");
        assert!(finished > trained_last + period, "peer {i} left while others still trained");
        finals.push(anchors);
    }
    let first = &finals[0];
    let differ = finals.iter().filter(|a| *a != first).count();
    assert_eq!(differ, 0, "{differ} of 100 peers finished with other anchors");
}

/// The node's in-process scenarios (tests/node_in_process.rs: a restart, a late join, a
/// healed partition) at once, at 120 peers: 12 restart from their checkpoints, two fresh
/// peers join late and a 80/40 partition heals; then every peer, the restarted and the
/// joiners too, holds the same states, the joiners without a step on the initial weights.
#[test]
fn restarts_late_joiners_and_a_healed_partition_at_120_peers() {
    let seed = seed_from_env(93);
    let n = 120;
    let mut sim = Sim::new(SimConfig::new(n, seed)).unwrap();
    let joiners = [118, 119];
    for j in joiners {
        sim.crash(j);
    }
    sim.run_cycles(3);
    for i in 0..12 {
        sim.crash(i);
    }
    sim.partition((0..n).map(|i| u8::from(i >= 80)).collect());
    sim.run_cycles(2);
    for i in 0..12 {
        sim.restart(i).unwrap();
    }
    for j in joiners {
        sim.join_fresh(j).unwrap();
    }
    sim.run_cycles(2);
    assert!(sim.consensus_distance() > 0.0, "seed {seed}: the partition should split the anchors");
    sim.heal();
    sim.run_cycles(3);
    let distinct: Vec<usize> = (0..2).map(|p| sim.distinct_states(p)).collect();
    assert!(sim.agree(), "seed {seed}: no agreement after the heal, distinct states {distinct:?}");
    for j in joiners {
        let (_, why, steps) = sim.life(j).released.clone().expect("a joiner was never released");
        assert_eq!(steps, 0, "seed {seed}: joiner {j} trained before it held anchors ({why:?})");
    }
    let restarted = (0..12).filter_map(|i| sim.protocol(i)).count();
    assert_eq!(restarted, 12, "seed {seed}: the restarted peers are live");
    assert!(sim.stats.adoptions > 0, "seed {seed}: the partition must have been reconciled");
    assert_eq!(sim.stats.unknown_lineage, 0, "seed {seed}");
}

/// The end of a run after a long partition, as `tests/partition.rs` runs it on real
/// processes, over many seeds: four peers of very different speeds split {0, 1} | {2, 3}
/// for longer than a credit lasts, healed, then each trains to its step target. The fast
/// ones stop contributing long before the slow ones, so their votes lapse; they merge on
/// alone (a lone delta where the slow peers' two pointed apart and were skipped) and must
/// still follow the counted voters' states to the end, and the last round's votes must not
/// be forgotten while nobody merges: every peer finishes with the same anchors.
#[test]
fn peers_that_stopped_contributing_finish_with_the_swarm() {
    let first = seed_from_env(0);
    let seeds = if std::env::var_os("SEED").is_some() { first..first + 1 } else { 0..100 };
    let mut split = Vec::new();
    for seed in seeds {
        let mut cfg = SimConfig::new(4, seed);
        // tests/common's tiny protocol: rounds of 200 ms, grace cap 40 ms, lag 0.
        let defaults = atoll::manifest::default_protocol();
        cfg.settings = RawSettings { h: 10, step_ms: 20, grace_cap_ms: 40, ..defaults };
        cfg.track_lineage = false;
        cfg.speed_range = (0.5, 2.0);
        cfg.net.latency_ms = (1, 5);
        cfg.step_target = Some(1_500);
        let mut sim = Sim::new(cfg).unwrap();
        sim.run_until(1_000);
        sim.partition(vec![0, 0, 1, 1]);
        sim.run_until(16_000);
        sim.heal();
        while (0..4).any(|i| sim.life(i).finished.is_none()) {
            assert!(sim.now() < 300_000, "seed {seed}: not every peer finished");
            sim.run_until(sim.now() + 1_000);
        }
        let finals: Vec<Vec<f32>> =
            (0..4).map(|i| sim.life(i).finished.clone().unwrap().1).collect();
        if finals.iter().any(|a| *a != finals[0]) {
            split.push(seed);
        }
    }
    assert!(split.is_empty(), "seeds that finished with different anchors: {split:?}");
}
