//! The CI-sized chaos run: `atoll chaos` with four tiny peers, kills, restarts and pauses on
//! a seeded schedule, against a failure-free run of the same manifest. Nobody exits
//! abnormally, every restarted peer contributes again, the anchors agree, and the loss
//! stays within 8% of the failure-free run. The same harness drives an elastic
//! data-parallel group under a kill: it keeps training without the killed member, and the
//! tokens that reach its model fall below the failure-free run's. The long runs are in
//! bench/RESULTS.md.
//!
//! Both swarm runs step at a fixed rate per peer ([`STEP_MS`]), so the failure-free run is
//! the same amount of work on any machine that holds the rate: unpaced, the peers left
//! running when one was killed or paused shared the cores with fewer others and computed
//! more (the chaos run trained 1.24× the failure-free run's tokens on an idle machine), and
//! the comparison measured the machine's load as much as the failures.

mod common;

use atoll::train::TrainConfig;

/// Every swarm peer's step floor: about twice a tiny step's time with four peers on two
/// cores, so a machine up to about twice slower still holds it.
const STEP_MS: &str = "30";

#[test]
fn a_swarm_under_kills_restarts_and_pauses_loses_almost_nothing() {
    let _serial = common::serial();
    let tmp = common::test_dir("chaos-");
    let mut train = TrainConfig::tiny(11);
    train.val_every = 500;
    train.schedule.decay_steps = 4_000;
    let config = common::write_manifest(
        tmp.path().join("tiny.json"),
        &common::tiny_manifest("chaos-test", train),
    );
    let run_dir = tmp.path().join("chaos");
    let args = ["chaos", "--peers", "4", "--duration", "40", "--mtbf", "10", "--downtime", "4"];
    let stdout = common::run_swarm_command(
        &[&args[..], &["--pause", "3", "--seed", "3", "--min-step-ms", STEP_MS]].concat(),
        &run_dir,
        &config,
    );
    let report = std::fs::read(run_dir.join("chaos.json")).expect("no chaos.json");
    let r: serde_json::Value = serde_json::from_slice(&report).unwrap();
    let int = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} missing in {r:#}"));
    let num = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} missing in {r:#}"));
    assert_eq!(int("abnormal_exits"), 0, "{stdout}");
    assert_eq!(int("min_step_ms").to_string(), STEP_MS, "{stdout}");
    assert_eq!(int("unreadable_checkpoints"), 0, "{stdout}");
    assert_eq!(r["anchors_agree"], true, "{stdout}");
    assert!(int("kills") >= 2 && int("pauses") >= 1, "too few faults: {stdout}");
    assert_eq!(int("restarts"), int("kills"), "{stdout}");
    assert_eq!(int("rejoined"), int("restarts"), "a restarted peer did not contribute: {stdout}");
    let (bpb, base) = (num("final_val_bpb"), num("baseline_val_bpb"));
    // Two noisy runs compared: the failure-free run alone read 3.268, 3.336 and 3.414 on
    // one machine (2026-11-29), the chaos run 3.459, 3.424 and 3.387 beside them (+5.8%,
    // +2.6%, −0.8%); a 5% bound failed one of two full CI runs on noise alone: 8%.
    assert!(bpb <= base * 1.08, "val_bpb {bpb} vs {base} without failures: {stdout}");
    assert!(num("goodput") > 0.5 && num("goodput") <= 1.05, "{stdout}");
    assert!(num("uptime") > 0.8, "{stdout}");
    eprintln!(
        "goodput {:.3} (baseline {:.3}), uptime {:.3}, val_bpb {bpb:.3} vs {base:.3}, \
         {} vs {} tokens",
        num("goodput"),
        num("baseline_goodput"),
        num("uptime"),
        int("useful_tokens"),
        int("baseline_useful_tokens")
    );
}

#[test]
fn an_elastic_data_parallel_group_goes_on_without_a_killed_member() {
    let _serial = common::serial();
    let tmp = common::test_dir("chaos-dp-");
    let mut train = TrainConfig::tiny(5);
    train.val_every = 1_000;
    let config = common::write_manifest(
        tmp.path().join("tiny.json"),
        &common::tiny_manifest("chaos-dp-test", train),
    );
    let run_dir = tmp.path().join("chaos");
    let args = ["chaos", "--method", "dp", "--peers", "3", "--duration", "18", "--mtbf", "6"];
    let stdout = common::run_swarm_command(
        &[
            &args[..],
            &["--kill-share", "1", "--downtime", "2", "--barrier-timeout", "3", "--seed", "2"],
        ]
        .concat(),
        &run_dir,
        &config,
    );
    let report = std::fs::read(run_dir.join("chaos.json")).expect("no chaos.json");
    let r: serde_json::Value = serde_json::from_slice(&report).unwrap();
    let int = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} missing in {r:#}"));
    let num = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} missing in {r:#}"));
    assert_eq!(r["method"], "dp", "{stdout}");
    assert_eq!(int("abnormal_exits"), 0, "{stdout}");
    let kills = int("kills");
    assert!(kills >= 1, "no kill applied: {stdout}");
    assert_eq!(int("restarts"), 0, "a group member was restarted: {stdout}");
    assert_eq!(int("finished"), 3 - kills, "{stdout}");
    assert!(r["final_val_bpb"].as_f64().is_some(), "no final model: {stdout}");
    // The survivors kept averaging after the kill: means over fewer than three members.
    let mut smaller = 0;
    for i in 0..3 {
        let path = run_dir.join("chaos").join(format!("peer-{i}")).join("merges.jsonl");
        for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
            let m: serde_json::Value = serde_json::from_str(line).unwrap();
            let n = m["contributions"].as_array().map_or(0, Vec::len);
            assert!((1..=3).contains(&n), "{m}");
            smaller += usize::from(n < 3);
        }
    }
    assert!(smaller >= 5, "the group did not go on without its killed member: {stdout}");
    // Tokens that reached the group's model over tokens computed: the killed members'
    // unfinished steps are lost, nothing else.
    let goodput = num("goodput");
    assert!(goodput > 0.5 && goodput <= 1.05, "{stdout}");
    let (useful, base) = (int("useful_tokens"), int("baseline_useful_tokens"));
    assert!(useful > 0 && base > 0, "{stdout}");
    eprintln!(
        "dp: goodput {goodput:.3} of computed, {:.3} of failure-free ({useful} vs {base} tokens), \
         {kills} kills, val_bpb {:.3} vs {:.3}",
        num("goodput_vs_failure_free"),
        num("final_val_bpb"),
        num("baseline_val_bpb")
    );
}
