//! Invariant: no lineage ever merges a contribution twice, and none is dropped: once churn
//! stops, every delta published for the settled rounds is in the agreed lineage.
//!
//! The simulator tracks each lineage's full set of merged contributions independently of
//! the protocol's bounded log (adoptions switch a peer to the adopted lineage's set).

use atoll::sim::{seed_from_env, Sim, SimConfig};

fn scenario(seed: u64, lag: u64) {
    let mut cfg = SimConfig::new(20, seed);
    cfg.settings.merge_lag = lag;
    // With lag 0 the sets differ at every merge under heterogeneous speeds and agree only
    // after reconciliation (mid-cycle); with one fragment the cycle end is after it.
    let fragments = if lag == 0 { 1 } else { 2 };
    cfg.settings.fragments = fragments;
    cfg.net.loss = 0.03;
    cfg.clock_skew_ms = 40;
    cfg.slow_fraction = 0.3;
    cfg.slow_factor = 3.0;
    let mut sim = Sim::new(cfg).unwrap();
    sim.run_cycles(2);
    for i in [1, 5, 9] {
        sim.crash(i);
    }
    sim.partition((0..20).map(|i| u8::from(i % 4 == 0)).collect());
    sim.run_cycles(2);
    for i in [1, 5, 9] {
        sim.restart(i).unwrap();
    }
    sim.run_cycles(1);
    sim.heal();
    sim.set_loss(0.0);
    let settled_from = sim.now() / sim.settings().period_ms() + 1;
    sim.run_cycles(6);
    let last = sim.now() / sim.settings().period_ms();
    assert!(sim.agree(), "seed {seed} lag {lag}: no agreement");
    assert_eq!(sim.stats.double_merges, 0, "seed {seed} lag {lag}: a delta was merged twice");
    assert_eq!(sim.stats.unknown_lineage, 0);
    // Every state adopted on evidence recomputed: honest states are never taken for forged.
    assert_eq!(sim.stats.offences, Default::default(), "seed {seed} lag {lag}: honest offences");
    let lineages = sim.lineages.as_ref().unwrap();
    // Rounds whose deltas have had time to be merged everywhere (lag + one spare round).
    let settled = settled_from..=last.saturating_sub(lag + 1);
    for p in 0..fragments {
        let missing = lineages.missing(2, p, settled.clone());
        assert_eq!(
            missing, 0,
            "seed {seed} lag {lag}: fragment {p} lost {missing} deltas of rounds {settled:?}"
        );
    }
    eprintln!("seed {seed} lag {lag}: {:?}", sim.stats);
}

#[test]
fn no_delta_merged_twice_or_lost_with_lag_1() {
    let seed = seed_from_env(11);
    scenario(seed, 1);
    scenario(seed + 1, 1);
}

#[test]
fn no_delta_merged_twice_or_lost_with_lag_0() {
    // Lag 0 merges sets that depend on arrival times: the most adoptions and re-queues.
    let seed = seed_from_env(21);
    scenario(seed, 0);
    scenario(seed + 1, 0);
}
