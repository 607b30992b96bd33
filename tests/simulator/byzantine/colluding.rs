//! A colluding minority sending well-formed poison together (a quarter of 16, a third of
//! 18, with dense and sparse deltas): the honest loss averaged over seeds, and the
//! attackers' share of the weight honest merges gave them, in every seed.

use super::*;

/// The most weight a quarter of colluding attackers may earn in honest merges, in any seed:
/// measured at most 0.057 (lag 0, oblique deltas) over seeds 76–87, 88–99 and 100–111, and
/// 0.020 for the other attacks (0.055 and 0.020 over 76–87 once only credited peers widen
/// a lag-0 set); a quarter of the tokens they claim would be 0.25, and
/// 0.07–0.28 is what they earn without agreement weights.
const SHARE_QUARTER: f64 = 0.08;
/// ... with sparse deltas: measured at most 0.109 (lag 0, oblique deltas).
const SHARE_SPARSE: f64 = 0.15;
/// ... and from a third of the peers: measured at most 0.120 (lag 0, oblique deltas; 0.102
/// once only credited peers widen a lag-0 set).
const SHARE_THIRD: f64 = 0.15;

/// Seeds averaged per figure below: at `merge_lag` 0 one seed's honest loss moves ±20%
/// with arrival order alone (every run takes about 0.05 s).
const SEEDS: u64 = 12;

/// How the honest peers merge: the defaults, without agreement weights, or with sparse
/// (top-k) deltas.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Setup {
    Default,
    NoAgreement,
    Sparse,
}

/// `hostile` of `peers` sending `attack` from evenly spread seats (`attack` `None`: those
/// seats empty), at `lag`, merging as `setup` says.
fn colluding(
    peers: usize,
    hostile: usize,
    attack: Option<Attack>,
    seed: u64,
    lag: u64,
    setup: Setup,
) -> Outcome {
    let mut cfg = SimConfig::new(peers, seed);
    cfg.settings.merge_lag = lag;
    cfg.settings.agreement_weights = setup != Setup::NoAgreement;
    if setup == Setup::Sparse {
        cfg.settings.encode = sparse_options();
    }
    let start = seat(seed) % peers;
    let seats: Vec<usize> =
        (0..hostile).map(|j| (start + j * peers / hostile.max(1)) % peers).collect();
    match attack {
        None => run_config(cfg, &seats),
        Some(a) => {
            cfg.hostile = seats.into_iter().map(|i| (i, a)).collect();
            run_config(cfg, &[])
        }
    }
}

/// What a colluding attack did over [`SEEDS`] seeds.
struct Damage {
    /// The honest loss over the unattacked loss (the larger of: the attackers' seats empty,
    /// and everyone honest), averaged over the seeds.
    loss: f64,
    /// The largest share of the weight the honest peers' merges gave the attackers
    /// (`Stats::hostile_share`) in any seed: their influence, measured directly. At lag 0
    /// the loss ratio of one seed moves with the arrival order alone, which the attackers
    /// change by being there: seed 86's 1.76× below came with a share of 0.000.
    share: f64,
}

impl Damage {
    /// Prints the damage and holds it to `loss` (the mean ratio) and `share` (the largest
    /// share); `what` names the case (seed, lag, attack) in both.
    fn assert_within(&self, loss: f64, share: f64, what: &str) {
        let (l, w) = (self.loss, self.share);
        eprintln!("{what}: honest loss {l:.3}x unattacked, weight share at most {w:.3}");
        assert!(l <= loss, "{what}: {l:.3}x");
        assert!(w <= share, "{what}: share {w:.3}");
    }
}

/// The damage of `attack` by `hostile` of `peers`. Each seed's ratio and share are printed
/// too: a mean inside its bound can hide one seed that blew up, and `SEED=n` replays it.
fn damage(
    peers: usize,
    hostile: usize,
    attack: Attack,
    seed: u64,
    lag: u64,
    setup: Setup,
) -> Damage {
    let run = |s: u64| {
        let empty = colluding(peers, hostile, None, s, lag, setup).loss;
        let honest = colluding(peers, 0, None, s, lag, setup).loss;
        let o = colluding(peers, hostile, Some(attack), s, lag, setup);
        (o.loss / empty.max(honest), o.sim.stats.hostile_share())
    };
    let runs: Vec<(f64, f64)> = (seed..seed + SEEDS).map(run).collect();
    let each: Vec<String> =
        runs.iter().zip(seed..).map(|((r, w), s)| format!("{s}:{r:.2}/{w:.3}")).collect();
    eprintln!(
        "{hostile}/{peers} {attack:?} lag {lag} {setup:?}, by seed (loss ratio/weight share): {}",
        each.join(" ")
    );
    Damage {
        loss: runs.iter().map(|r| r.0).sum::<f64>() / SEEDS as f64,
        share: runs.iter().map(|r| r.1).fold(0.0, f64::max),
    }
}

/// The attacks that need no provable offence: an author-bound delta within the manifest's
/// claims, reversed, scaled or aimed against the honest direction.
const WELL_FORMED: [Attack; 5] = [
    Attack::Reversed,
    Attack::Direction,
    Attack::Oblique,
    Attack::ScaledPoison { stolen: false },
    Attack::ScaledPoison { stolen: true },
];

/// A quarter of 16 peers sending well-formed poison together, at both lags: the honest
/// loss stays within the bound, where without agreement weights the same attack costs far
/// more (so the test can fail).
#[test]
fn a_quarter_of_colluding_attackers_are_bounded() {
    let seed = seed_from_env(76);
    for lag in [0, 1] {
        for a in WELL_FORMED {
            let on = damage(16, 4, a, seed, lag, Setup::Default);
            let off = damage(16, 4, a, seed, lag, Setup::NoAgreement);
            let what = format!("seed {seed}: lag {lag}: 4/16 {a:?}");
            eprintln!("{what}: without agreement weights {:.3}x, share {:.3}", off.loss, off.share);
            on.assert_within(BOUND_QUARTER, SHARE_QUARTER, &what);
            assert!(
                off.loss > 1.1 && off.share > SHARE_QUARTER,
                "seed {seed}: lag {lag}: 4/16 {a:?}: harmless undefended ({:.3}x, share {:.3})",
                off.loss,
                off.share
            );
        }
    }
}

/// Sparse (top-k, 2-bit) deltas under a quarter of colluding well-formed attackers: the
/// honest loss stays within [`BOUND_SPARSE`], and the honest peers come together on one
/// state between merges and never merge anything twice. Top-k leaves most coordinates of
/// each delta zero (top-k weakens distance-based screening: arXiv 2505.01454); while zeros
/// voted in the agreement's medians, the round's median direction was zero almost
/// everywhere, honest sparse swarms skipped over half their rounds for want of weight, and
/// these attacks cost 1.6–2.1×. Zeros now abstain (`Bounds::abstain`).
#[test]
fn sparse_deltas_under_attack_are_bounded_and_come_together() {
    let seed = seed_from_env(79);
    for lag in [0, 1] {
        for a in WELL_FORMED {
            let what = format!("seed {seed}: lag {lag}: top2 4/32 {a:?}");
            damage(16, 4, a, seed, lag, Setup::Sparse).assert_within(
                BOUND_SPARSE,
                SHARE_SPARSE,
                &what,
            );
            assert_come_together(seed, lag, a);
        }
    }
}

/// Seed 200 split at lag 0 with stolen copies until the round's second look: one honest
/// peer counted its own vote (and its own credit of itself) and kept its state at the
/// first look, while the eleven others, who did not count it, took another.
#[test]
fn a_peer_that_kept_its_own_state_at_the_first_look_comes_back() {
    assert_come_together(200, 0, Attack::ScaledPoison { stolen: true });
}

/// 4 of 16 peers attack with `a` at merge lag `lag`: the honest peers hold one state at
/// some moment of the run's last period, and nothing was merged twice.
fn assert_come_together(seed: u64, lag: u64, a: Attack) {
    let mut cfg = SimConfig::new(16, seed);
    cfg.settings.merge_lag = lag;
    cfg.settings.encode = sparse_options();
    cfg.hostile = (0..4).map(|j| ((seat(seed) + 4 * j) % 16, a)).collect();
    let period = cfg.settings.h * cfg.settings.step_ms;
    let mut o = run_config(cfg, &[]);
    let apart = apart_for_a_period(&mut o.sim, period);
    let s = &o.sim.stats;
    assert!(
        apart.is_empty(),
        "seed {seed}: lag {lag}: top2: {a:?}: fragments {apart:?} held several honest states \
         for a whole period, {s:?}"
    );
    assert_eq!(s.double_merges, 0, "seed {seed}: lag {lag}: top2: {a:?}");
    assert_eq!(s.unknown_lineage, 0, "seed {seed}: lag {lag}: top2: {a:?}");
}

/// The fragments whose honest peers did not hold one state at any moment of the next
/// `period` (sampled every 50 ms). At merge lag 0 every peer merges the set it holds, so
/// right after a round they differ until they reconcile (about half a period here).
fn apart_for_a_period(sim: &mut Sim, period: u64) -> Vec<usize> {
    let mut together = [false; FRAGMENTS];
    for _ in 0..period / 50 {
        let t = sim.now() + 50;
        sim.run_until(t);
        for (p, ok) in together.iter_mut().enumerate() {
            *ok |= sim.honest_distinct_states(p) == 1;
        }
    }
    (0..FRAGMENTS).filter(|&p| !together[p]).collect()
}

/// The default run's codec at the simulator's scale (its fragments hold 64 values): top-k
/// at 1/8 (the default keeps 512 of 4,096) with its fading error feedback.
fn sparse_options() -> EncodeOptions {
    let default = atoll::manifest::default_encode();
    EncodeOptions { block: 32, keep: 4, zstd_level: 0, ..default }
}

/// The attack the bounds above do not hold against (SECURITY.md, "What it cannot
/// defend"): a quarter of 16 sending the oblique delta turned towards the momentum just
/// enough to keep its whole weight (`Attack::Aligned`). Measured over seeds 76–87: dense
/// 0.99× at lag 0 and 1.32× at lag 1 (share up to 0.17), sparse 1.09× at lag 0 (share
/// 0.13); the run still converges, within the bound for a third.
#[test]
fn a_quarter_sending_aligned_deltas_does_not_stop_training() {
    let seed = seed_from_env(76);
    for setup in [Setup::Default, Setup::Sparse] {
        for lag in [0, 1] {
            let what = format!("seed {seed}: lag {lag}: 4/16 {setup:?} Aligned");
            damage(16, 4, Attack::Aligned, seed, lag, setup).assert_within(BOUND_THIRD, 1.0, &what);
        }
    }
}

/// A third of 18 peers: the run still converges, within the bound SECURITY.md states.
#[test]
fn a_third_of_colluding_attackers_do_not_stop_training() {
    let seed = seed_from_env(77);
    for lag in [0, 1] {
        for a in WELL_FORMED {
            let what = format!("seed {seed}: lag {lag}: 6/18 {a:?}");
            damage(18, 6, a, seed, lag, Setup::Default).assert_within(
                BOUND_THIRD,
                SHARE_THIRD,
                &what,
            );
        }
    }
}

/// The defence's price in an honest swarm: weighing by agreement moves the honest loss by
/// at most 2% (both lags, averaged over seeds).
#[test]
fn agreement_weights_cost_an_honest_swarm_under_two_percent() {
    let seed = seed_from_env(78);
    for lag in [0, 1] {
        let loss = |setup: Setup| {
            (seed..seed + SEEDS).map(|s| colluding(16, 0, None, s, lag, setup).loss).sum::<f64>()
        };
        let (on, off) = (loss(Setup::Default), loss(Setup::NoAgreement));
        eprintln!("seed {seed}: lag {lag}: honest loss {:.3}x with agreement weights", on / off);
        assert!(on <= 1.02 * off, "seed {seed}: lag {lag}: {on:.4} against {off:.4}");
    }
}
