//! Invariant: once churn stops, all live peers hold bit-identical states (anchor, momentum,
//! merged log) of every fragment within a few rounds — after crashes, restarts, a partition
//! and message loss. `SEED=n` replays a failure.

use atoll::sim::{seed_from_env, Sim, SimConfig};

#[test]
fn calm_swarm_agrees_every_round() {
    let seed = seed_from_env(1);
    let mut sim = Sim::new(SimConfig::new(16, seed)).unwrap();
    sim.run_cycles(2);
    for _ in 0..6 {
        sim.run_cycles(1);
        assert!(sim.agree(), "seed {seed}: disagreement in a calm swarm at t={}", sim.now());
    }
    assert_eq!(sim.stats.adoptions, 0, "seed {seed}");
    assert_eq!(sim.consensus_distance(), 0.0);
}

#[test]
fn agreement_returns_after_crashes_partition_and_loss() {
    for seed in [seed_from_env(2), seed_from_env(2) + 1000] {
        churn_then_agree(seed);
    }
}

fn churn_then_agree(seed: u64) {
    let mut cfg = SimConfig::new(24, seed);
    cfg.net.loss = 0.05;
    cfg.clock_skew_ms = 30;
    let mut sim = Sim::new(cfg).unwrap();
    sim.run_cycles(3);
    // Churn: a third of the swarm crashes; a 16/8 partition; restarts during it.
    for i in 0..8 {
        sim.crash(i);
    }
    sim.run_cycles(2);
    sim.partition((0..24).map(|i| u8::from(i >= 16)).collect());
    for i in 0..8 {
        sim.restart(i).unwrap();
    }
    sim.run_cycles(3);
    let split = sim.consensus_distance();
    assert!(split > 0.0, "seed {seed}: a partition should split the anchors");
    sim.heal();
    sim.set_loss(0.0);
    // Churn is over: agreement within 3 cycles, and it lasts.
    sim.run_cycles(3);
    for _ in 0..3 {
        let distinct: Vec<usize> = (0..2).map(|p| sim.distinct_states(p)).collect();
        assert!(
            sim.agree(),
            "seed {seed}: no agreement at {} ms, distinct states {distinct:?}",
            sim.now()
        );
        sim.run_cycles(1);
    }
    assert_eq!(sim.consensus_distance(), 0.0);
    assert!(sim.stats.adoptions > 0, "seed {seed}: the partition must have been reconciled");
    assert_eq!(sim.stats.unknown_lineage, 0);
    eprintln!("seed {seed}: split distance {split:.3e}, {:?}", sim.stats);
}

#[test]
fn restarted_peer_catches_up_within_a_cycle_without_stale_deltas() {
    let seed = seed_from_env(3);
    let mut sim = Sim::new(SimConfig::new(10, seed)).unwrap();
    sim.run_cycles(3);
    sim.crash(3);
    sim.run_cycles(4);
    sim.restart(3).unwrap();
    sim.run_cycles(1);
    assert!(sim.agree(), "seed {seed}: restarted peer did not catch up in one cycle");
    let restarted = sim.protocol(3).unwrap();
    assert!(restarted.metrics().adoptions >= 1, "seed {seed}: it must have fetched a state");
    // Nobody received an outlier delta taken against the restarted peer's stale anchor.
    assert_eq!(sim.stats.misbehaved, 0, "seed {seed}");
}

#[test]
fn larger_quorum_and_blending_still_agree() {
    let seed = seed_from_env(4);
    let mut cfg = SimConfig::new(12, seed);
    cfg.settings.quorum = 4;
    cfg.settings.alpha = 0.5;
    cfg.net.loss = 0.02;
    let mut sim = Sim::new(cfg).unwrap();
    let initial = sim.mean_anchor_loss();
    sim.run_cycles(8);
    assert!(sim.agree(), "seed {seed}");
    assert!(sim.stats.merged_contributions >= 4 * sim.stats.merges, "seed {seed}: {:?}", sim.stats);
    assert!(sim.mean_anchor_loss() < 0.5 * initial, "seed {seed}");
}
