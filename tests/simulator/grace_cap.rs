//! Invariant: with `K = 1` no peer waits beyond the grace cap after holding its quorum,
//! even with slow peers and skewed clocks; the adaptive window is really used, and with
//! `γ = 0` nobody waits at all (DESIGN.md §2.3, §3.1.1).

use atoll::sim::{seed_from_env, Sim, SimConfig};

fn heterogeneous(seed: u64, lag: u64, gamma: f64) -> Sim {
    let mut cfg = SimConfig::new(24, seed);
    cfg.settings.quorum = 1;
    cfg.settings.merge_lag = lag;
    cfg.settings.gamma = gamma;
    cfg.settings.grace_cap_ms = 150;
    // Half the swarm is 4x slower; clocks disagree by up to 50 ms.
    cfg.slow_fraction = 0.5;
    cfg.slow_factor = 4.0;
    cfg.clock_skew_ms = 50;
    cfg.net.latency_ms = (5, 80);
    let mut sim = Sim::new(cfg).unwrap();
    sim.run_cycles(8);
    sim
}

#[test]
fn k1_never_waits_beyond_the_cap() {
    let seed = seed_from_env(31);
    for lag in [0, 1] {
        let sim = heterogeneous(seed, lag, 0.5);
        let cap = sim.settings().raw().grace_cap_ms;
        assert!(sim.stats.merges > 250, "seed {seed} lag {lag}: only {} merges", sim.stats.merges);
        assert!(
            sim.stats.max_waited_ms <= cap,
            "seed {seed} lag {lag}: waited {} ms, cap {cap}",
            sim.stats.max_waited_ms
        );
        let mean_grace = sim.stats.grace_sum_ms as f64 / sim.stats.merges as f64;
        assert!(mean_grace > 10.0, "seed {seed} lag {lag}: grace unused ({mean_grace} ms)");
        eprintln!("seed {seed} lag {lag}: mean grace {mean_grace:.0} ms, {:?}", sim.stats);
    }
}

#[test]
fn no_grace_means_no_wait() {
    let seed = seed_from_env(32);
    let sim = heterogeneous(seed, 0, 0.0);
    assert_eq!(sim.stats.max_waited_ms, 0, "seed {seed}");
    assert_eq!(sim.stats.grace_sum_ms, 0, "seed {seed}");
    assert!(sim.stats.merges > 300, "seed {seed}");
}
