//! The CI-sized chaos run: `atoll chaos` with four tiny peers, kills, restarts and pauses on
//! a seeded schedule, against a failure-free run of the same manifest. Nobody exits
//! abnormally, every restarted peer contributes again, the anchors agree, and the loss
//! stays within 5% of the failure-free run. The long run is in bench/RESULTS.md.

mod common;

use atoll::train::TrainConfig;

#[test]
fn a_swarm_under_kills_restarts_and_pauses_loses_almost_nothing() {
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
        &[&args[..], &["--pause", "3", "--seed", "3"]].concat(),
        &run_dir,
        &config,
    );
    let report = std::fs::read(run_dir.join("chaos.json")).expect("no chaos.json");
    let r: serde_json::Value = serde_json::from_slice(&report).unwrap();
    let int = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} missing in {r:#}"));
    let num = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} missing in {r:#}"));
    assert_eq!(int("abnormal_exits"), 0, "{stdout}");
    assert_eq!(int("unreadable_checkpoints"), 0, "{stdout}");
    assert_eq!(r["anchors_agree"], true, "{stdout}");
    assert!(int("kills") >= 2 && int("pauses") >= 1, "too few faults: {stdout}");
    assert_eq!(int("restarts"), int("kills"), "{stdout}");
    assert_eq!(int("rejoined"), int("restarts"), "a restarted peer did not contribute: {stdout}");
    let (bpb, base) = (num("final_val_bpb"), num("baseline_val_bpb"));
    assert!(bpb <= base * 1.05, "val_bpb {bpb} vs {base} without failures: {stdout}");
    assert!(num("goodput") > 0.5 && num("goodput") <= 1.05, "{stdout}");
    assert!(num("uptime") > 0.8, "{stdout}");
    eprintln!(
        "goodput {:.3} (baseline {:.3}), uptime {:.3}, val_bpb {bpb:.3} vs {base:.3}",
        num("goodput"),
        num("baseline_goodput"),
        num("uptime")
    );
}
