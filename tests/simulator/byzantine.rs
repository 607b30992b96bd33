//! Invariants under hostile peers (src/sim/byzantine.rs): a fraction of the swarm crafts
//! what it gossips and serves — inflated claims, scaled poison, huge values, zero deltas with
//! maximal claims, forged authors, equivocation, Sybil vote takeovers — and the honest
//! peers must not panic, must end on one state, and must train about as well as without
//! them. `SEED=n` replays a failure.
//!
//! Weight claims within the manifest's bounds are only bounded, not neutralised, and have
//! their own test with the bound measured for them (SECURITY.md, "What it cannot defend").
//! Well-formed poison (reversed, scaled, aimed against the honest direction) is weighed by
//! its agreement with the round: neutralised from one peer in eight, bounded from a
//! quarter and a third of colluding peers, at both merge lags — in the honest loss (a
//! mean over seeds) and in the attackers' share of the weight honest merges gave them (in
//! every seed). A Sybil majority that earns
//! vote credit with well-formed deltas is outside the threat model: it must not crash
//! anyone, and nothing more is asserted of it.

use atoll::delta::EncodeOptions;
use atoll::proto::Offence;
use atoll::sim::byzantine::{Attack, Forgery};
use atoll::sim::{seed_from_env, Sim, SimConfig};
use std::panic::{catch_unwind, AssertUnwindSafe};

const PEERS: usize = 8;
/// Fragments of the simulator's model.
const FRAGMENTS: usize = 2;
const CYCLES: u64 = 12;
/// Cycles at the end whose honest losses are averaged (one cycle's value is noisy).
const TAIL: usize = 4;
/// A Sybil vote takeover whose Sybils first earn vote credit with well-formed deltas.
const CREDITED_SYBILS: Attack =
    Attack::VoteTakeover { sybils: 24, forged: Forgery::ForgedLog, earn_credit: true };

/// A Sybil majority: outside the threat model for agreement and loss.
fn sybil_majority(a: Attack) -> bool {
    a == CREDITED_SYBILS
}

/// Attacks the core bounds but cannot neutralise, with the most honest loss (× the
/// honest-only run) measured for them at f = 1/8 over seeds 71–74, plus a margin. Scaled,
/// reversed, huge and zero deltas were bounded here (up to 1.96×) until agreement weights
/// took their weight away; they are now held to the 2% of the neutralised.
fn bounded(a: Attack) -> Option<f64> {
    match a {
        Attack::InflatedSteps => Some(BOUND_CLAIMS),
        _ => None,
    }
}

/// Measured at most 1.15× (an honest delta weighed as twice the median author's).
const BOUND_CLAIMS: f64 = 1.3;
/// Well-formed poison from a quarter of the peers, mean over [`SEEDS`] seeds: measured at
/// most 1.020× (lag 1, oblique deltas; seeds 76–87) and 1.021× over 12-seed windows from 88,
/// 100 and 112; 1.25–6.29× without agreement weights. The bound is the 5% SECURITY.md
/// states for a colluding quarter (1.1 until every contribution was held against the
/// momentum and only credited peers widened a lag-0 set).
const BOUND_QUARTER: f64 = 1.05;
/// ... and from a third: measured at most 1.134× (lag 1, oblique deltas); aimed deltas
/// cost 1.27× before every contribution was held against the momentum.
const BOUND_THIRD: f64 = 1.5;
/// ... and from a quarter with sparse deltas: measured at most 1.052× over seeds 79–90 and
/// 1.139× over 107–118 (lag 0, oblique deltas); aimed deltas cost 1.22–1.30× over those
/// windows before every contribution was held against the momentum.
const BOUND_SPARSE: f64 = 1.25;

/// What a run ended with, seen from the honest peers.
struct Outcome {
    /// Honest anchor loss at the start and after each cycle.
    curve: Vec<f64>,
    /// Mean of the last `TAIL` points of `curve`.
    loss: f64,
    /// Distinct honest states per fragment at the ends of the last three cycles.
    distinct: Vec<Vec<usize>>,
    sim: Sim,
}

/// `peers` peers, `hostile` attacking, `absent` crashed before the first round.
fn run(peers: usize, seed: u64, hostile: Vec<(usize, Attack)>, absent: Option<usize>) -> Outcome {
    let mut cfg = SimConfig::new(peers, seed);
    cfg.hostile = hostile;
    run_config(cfg, absent.as_slice())
}

/// `cfg` to the end, the peers `absent` crashed before the first round.
fn run_config(cfg: SimConfig, absent: &[usize]) -> Outcome {
    let mut sim = Sim::new(cfg).unwrap();
    absent.iter().for_each(|&i| sim.crash(i));
    let mut curve = vec![sim.honest_anchor_loss()];
    let mut distinct = Vec::new();
    for c in 0..CYCLES {
        sim.run_cycles(1);
        curve.push(sim.honest_anchor_loss());
        if c + 3 >= CYCLES {
            distinct.push((0..FRAGMENTS).map(|p| sim.honest_distinct_states(p)).collect());
        }
    }
    let loss = curve[curve.len() - TAIL..].iter().sum::<f64>() / TAIL as f64;
    Outcome { curve, loss, distinct, sim }
}

/// The attacker's seat in an 8-peer swarm, drawn from the seed.
fn seat(seed: u64) -> usize {
    (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % PEERS
}

/// `k` hostile peers of `peers`, spread from a seeded seat, attacks dealt round-robin.
fn hostile_set(peers: usize, k: usize, seed: u64) -> Vec<(usize, Attack)> {
    let all = Attack::catalogue();
    (0..k).map(|j| ((seat(seed) + j * peers / k.max(1)) % peers, all[j % all.len()])).collect()
}

/// The offence an attack must be reported as (where it is provable at all).
fn expected_offence(a: Attack) -> Option<Offence> {
    match a {
        Attack::InflatedTokens => Some(Offence::InflatedClaim),
        Attack::ForgedOrigin => Some(Offence::ForgedAuthor),
        Attack::StolenDelta => Some(Offence::ClaimMismatch),
        Attack::Equivocation { .. } => Some(Offence::Equivocation),
        _ => None,
    }
}

fn assert_agree(seed: u64, a: Attack) {
    let o = run(PEERS, seed, vec![(seat(seed), a)], None);
    let s = &o.sim.stats;
    assert!(
        o.distinct.iter().flatten().all(|&d| d == 1),
        "seed {seed}: {a:?}: honest peers disagree, distinct states per fragment at the last \
         three cycle ends {:?} ({} adoptions)",
        o.distinct,
        s.adoptions
    );
    assert_eq!(s.unknown_lineage, 0, "seed {seed}: {a:?}: an honest peer adopted a forged state");
    assert_eq!(s.double_merges, 0, "seed {seed}: {a:?}");
}

/// Honest loss with the attacker against the honest-only runs of the same seed: the
/// attacker's seat empty, and the attacker honest. A neutralised attacker either has its
/// work refused (the first) or contributes honestly (the second); the two differ by up to
/// 3% on their own (7 vs 8 peers' noise), so the bound is against the larger.
fn assert_loss(seed: u64, a: Attack, bound: f64) {
    let s = seat(seed);
    let absent = run(PEERS, seed, Vec::new(), Some(s)).loss;
    let honest = run(PEERS, seed, Vec::new(), None).loss;
    let o = run(PEERS, seed, vec![(s, a)], None);
    let ratio = o.loss / absent.max(honest);
    eprintln!(
        "seed {seed}: {a:?}: honest loss {:.4}, honest-only {absent:.4} (seat empty) / \
         {honest:.4} (all honest): {ratio:.3}x",
        o.loss
    );
    assert!(ratio <= bound, "seed {seed}: {a:?}: honest loss {:.4} is {ratio:.3}x", o.loss);
}

#[test]
fn honest_peers_never_panic() {
    let seed = seed_from_env(71);
    let mut attacks = Attack::catalogue();
    attacks.push(CREDITED_SYBILS);
    for a in attacks {
        let got = catch_unwind(AssertUnwindSafe(|| run(PEERS, seed, vec![(seat(seed), a)], None)));
        let Ok(o) = got else { panic!("seed {seed}: {a:?} made a peer panic") };
        assert!(o.curve.iter().all(|l| l.is_finite()), "seed {seed}: {a:?}: {:?}", o.curve);
        if let Some(off) = expected_offence(a) {
            let n = o.sim.stats.offences.get(&off).copied().unwrap_or(0);
            assert!(
                n > 0,
                "seed {seed}: {a:?} never reported as {off}: {:?}",
                o.sim.stats.offences
            );
        }
    }
    // A third of the swarm hostile, one of each attack, no panic either.
    let mixed = catch_unwind(AssertUnwindSafe(|| run(12, seed, hostile_set(12, 4, seed), None)));
    assert!(mixed.is_ok(), "seed {seed}: mixed attacks at f = 1/3 made a peer panic");
}

#[test]
fn honest_anchors_agree_under_attack() {
    let seed = seed_from_env(72);
    Attack::catalogue()
        .into_iter()
        .filter(|&a| !sybil_majority(a))
        .for_each(|a| assert_agree(seed, a));
}

#[test]
fn honest_loss_within_two_percent_at_one_eighth() {
    let seed = seed_from_env(73);
    let neutralised = Attack::catalogue().into_iter().filter(|&a| bounded(a).is_none());
    neutralised.filter(|&a| !sybil_majority(a)).for_each(|a| assert_loss(seed, a, 1.02));
}

#[test]
fn bounded_attacks_stay_within_their_measured_bounds() {
    let seed = seed_from_env(73);
    for a in Attack::catalogue() {
        if let Some(bound) = bounded(a) {
            assert_loss(seed, a, bound);
        }
    }
}

/// Sybils that earn vote credit and vote, together, for a poisoned copy of their owner's
/// state (its parent and contribution set, which the honest peers hold): a majority of the
/// counted votes, refused by every honest peer that recomputes it, so the swarm keeps
/// training on one honest lineage. (The Sybils' copied deltas still hold most of the
/// merge weight — a Sybil majority of contributors, outside the threat model — so the
/// honest loss is only required to keep falling; with a state nobody recomputes, the
/// same Sybils drive it to 10⁹.)
#[test]
fn credited_sybils_cannot_impose_a_state_honest_peers_recompute() {
    let seed = seed_from_env(75);
    let a = Attack::VoteTakeover { sybils: 24, forged: Forgery::KnownParent, earn_credit: true };
    let o = run(PEERS, seed, vec![(seat(seed), a)], None);
    let forged = o.sim.stats.offences.get(&Offence::ForgedState).copied().unwrap_or(0);
    eprintln!("seed {seed}: {:?}, honest loss by cycle {:?}", o.sim.stats.offences, o.curve);
    assert!(forged > 0, "seed {seed}: no forged state was caught");
    assert!(o.distinct.iter().flatten().all(|&d| d == 1), "seed {seed}: {:?}", o.distinct);
    assert_eq!(o.sim.stats.unknown_lineage, 0, "seed {seed}: a forged state was adopted");
    assert!(o.loss < 0.1 * o.curve[0], "seed {seed}: {:?}", o.curve);
}

#[test]
fn loss_curve_by_hostile_fraction() {
    let seed = seed_from_env(74);
    let peers = 24;
    for (name, k) in [("0", 0), ("1/8", 3), ("1/4", 6), ("1/3", 8)] {
        let o = run(peers, seed, hostile_set(peers, k, seed), None);
        let curve: Vec<String> = o.curve.iter().map(|l| format!("{l:.3}")).collect();
        eprintln!(
            "seed {seed}: f = {name:>3} ({k:>2}/{peers}): tail {:.4}, loss by cycle [{}], {:?}",
            o.loss,
            curve.join(" "),
            o.sim.stats.offences
        );
        assert!(o.loss < 0.1 * o.curve[0], "seed {seed}: f = {name}: {:?}", o.curve);
    }
}

mod colluding;

/// A credited minority — the attacker and 5 Sybils that earn their votes with copies of its
/// delta, 6 voters against 7 honest peers — voting for a state that names a parent nobody
/// holds: no honest peer takes it and the honest peers end on one state, at merge lag 1
/// and at lag 0 with strict states (`strict_states`). Without them, at lag 0, two such voters
/// impose it (SECURITY.md, "A forged state nobody can recompute"; the bench's
/// `--vote-minority` measures every case).
#[test]
fn a_credited_minority_cannot_impose_a_state_nobody_can_recompute() {
    let seed = seed_from_env(76);
    let a = Attack::VoteTakeover { sybils: 5, forged: Forgery::ForgedLog, earn_credit: true };
    for lag in [1, 0] {
        let mut cfg = SimConfig::new(PEERS, seed);
        cfg.settings.merge_lag = lag;
        cfg.settings.strict_states = true;
        let clean = run_config(cfg.clone(), &[]);
        cfg.hostile = vec![(seat(seed), a)];
        let o = run_config(cfg, &[]);
        eprintln!(
            "seed {seed} lag {lag}: {:?}, honest loss by cycle {:?}",
            o.sim.stats.offences, o.curve
        );
        let adopted = o.sim.stats.unknown_lineage;
        assert_eq!(adopted, 0, "seed {seed} lag {lag}: a made-up state was adopted");
        // At lag 1 as low as ever; at lag 0 within twice the unattacked run's.
        let bound = if lag == 1 { 0.1 * o.curve[0] } else { 2.0 * clean.loss };
        assert!(o.loss < bound, "seed {seed} lag {lag}: {} against {}", o.loss, clean.loss);
        // At lag 0 the honest peers, refusing the colluders' state round after round, may
        // end a run on states of their own (measured in bench/RESULTS.md, "Strict states").
        if lag == 1 {
            let one = o.distinct.iter().flatten().all(|&d| d == 1);
            assert!(one, "seed {seed}: {:?}", o.distinct);
        }
    }
}

/// The same minority of two (an attacker and one Sybil) voting for a state made on the
/// honest parent whose log lists deltas nobody holds: a peer that holds the parent fetches
/// the listed deltas to check it (src/proto/check.rs), none comes, and the state is not
/// adopted — at lag 0, where the honest votes are spread one or two to a state.
#[test]
fn a_state_listing_deltas_nobody_serves_is_not_adopted_at_lag_zero() {
    let seed = seed_from_env(77);
    let a = Attack::VoteTakeover { sybils: 1, forged: Forgery::UnservedLog, earn_credit: true };
    let mut cfg = SimConfig::new(PEERS, seed);
    cfg.settings.merge_lag = 0;
    cfg.settings.strict_states = true;
    let clean = run_config(cfg.clone(), &[]);
    cfg.hostile = vec![(seat(seed), a)];
    let o = run_config(cfg, &[]);
    eprintln!("seed {seed}: honest loss {} (unattacked {})", o.loss, clean.loss);
    assert_eq!(o.sim.stats.unknown_lineage, 0, "seed {seed}: a forged state was adopted");
    assert!(o.loss < 2.0 * clean.loss, "seed {seed}: {} against {}", o.loss, clean.loss);
}
