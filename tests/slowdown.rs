//! Heterogeneous speeds and scavenging in real processes: `atoll demo --slowdown F
//! --slow-peers N` makes a peer's inner steps F times slower (`atoll run --slowdown F`),
//! and `--late-peers N --late-after S` adds peers to a running swarm. Speeds are compared
//! by step counts over the same run, not by timing assertions.

mod common;

use std::process::Command;

use atoll::train::TrainConfig;

#[test]
fn a_throttled_peer_steps_slower_and_a_late_peer_joins_the_swarm() {
    let _serial = common::serial();
    let tmp = common::test_dir("atoll-slowdown");
    let mut train = TrainConfig::tiny(11);
    // No validation pass inside the run: only inner steps are slowed, and a pass would
    // weigh on the fast peer's count.
    train.val_every = 100_000;
    let manifest = common::tiny_manifest("slowdown-test", train);
    let config = common::write_manifest(tmp.path().join("tiny.json"), &manifest);
    let run_dir = tmp.path().join("demo");
    let args = [
        "demo",
        "--peers",
        "2",
        "--duration",
        "12",
        "--slowdown",
        "4",
        "--slow-peers",
        "1",
        "--late-peers",
        "1",
        "--late-after",
        "4",
        "--timeout",
        "90",
    ];
    let out = common::run_swarm_command(&args, &run_dir, &config);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("summary.json")).unwrap()).unwrap();
    let peers = summary["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 3, "{out}");
    let steps: Vec<u64> = peers.iter().map(|p| p["steps"].as_u64().unwrap()).collect();
    let factors: Vec<f64> = peers.iter().map(|p| p["slowdown"].as_f64().unwrap()).collect();
    let starts: Vec<u64> = peers.iter().map(|p| p["started_after_s"].as_u64().unwrap()).collect();
    // Peer 1 (the last of --peers) is slowed; peer 2 is the late one, at full speed.
    assert_eq!(factors, [1.0, 4.0, 1.0], "{summary:#}");
    assert_eq!(starts, [0, 0, 4], "{summary:#}");
    // Both trained the same 12 s: 4× slower steps give about a quarter of the steps
    // (the slow peer's idle time leaves the cores to the others, so more than 4× apart
    // is possible; without the throttle they would be about equal).
    assert!(steps[1] > 0 && steps[1] * 2 < steps[0], "steps {steps:?}\n{out}");
    // The late peer trained, with the swarm: it took the anchors and merged.
    assert!(steps[2] > 0, "steps {steps:?}\n{out}");
    let late: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("peer-2/status.json")).unwrap())
            .unwrap();
    assert!(late["training"]["merges"].as_u64().unwrap() > 0, "{late:#}");
    assert_eq!(summary["anchors_agree"], true, "{summary:#}");
    let log = std::fs::read_to_string(run_dir.join("peer-1/peer.log")).unwrap();
    assert!(log.contains("slowdown=4"), "the slow peer does not report its slowdown");
}

/// Runs `atoll ARGS`; returns whether it succeeded and its stderr.
fn atoll(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_atoll")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn nonsense_slowdowns_and_flag_combinations_are_refused_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let dir = dir.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["run", "--run-dir", dir, "--slowdown", "0.5"], "from 1 (full speed)"),
        (&["run", "--run-dir", dir, "--slowdown", "NaN"], "from 1 (full speed)"),
        (&["run", "--run-dir", dir, "--slowdown", "fast"], "is not a number"),
        (&["run", "--run-dir", dir, "--no-train", "--slowdown", "2"], "slow a training peer"),
        (&["run", "--run-dir", dir, "--no-train", "--min-step-ms", "50"], "slow a training peer"),
        (&["run", "--run-dir", dir, "--min-step-ms", "600001"], "longer than the 600s accepted"),
        (&["chaos", "--run-dir", dir, "--min-step-ms", "0"], "not in 1..=600000"),
        (&["demo", "--run-dir", dir, "--min-step-ms", "600001"], "not in 1..=600000"),
        (&["demo", "--run-dir", dir, "--slowdown", "inf"], "from 1 (full speed)"),
        (&["demo", "--run-dir", dir, "--slow-peers", "1"], "needs --slowdown"),
        (
            &["demo", "--run-dir", dir, "--peers", "2", "--slowdown", "2", "--slow-peers", "3"],
            "more than --peers",
        ),
        (&["demo", "--run-dir", dir, "--late-peers", "1"], "needs --late-after"),
        (&["demo", "--run-dir", dir, "--late-after", "5"], "needs --late-peers"),
        (
            &[
                "demo",
                "--run-dir",
                dir,
                "--late-peers",
                "1",
                "--late-after",
                "9",
                "--duration",
                "9",
            ],
            "must be less than --duration",
        ),
        (&["demo", "--run-dir", dir, "--method", "dp", "--slowdown", "2"], "not --method dp"),
        (&["run", "--run-dir", dir, "--micro-batch", "0"], "not in 1..=4096"),
        (&["train", "--run-dir", dir, "--micro-batch", "5000"], "not in 1..=4096"),
    ];
    for (args, why) in cases {
        let (ok, err) = atoll(args);
        assert!(!ok, "atoll {} was accepted", args.join(" "));
        assert!(err.contains(why), "atoll {}: expected {why:?} in\n{err}", args.join(" "));
    }
    // Nothing was started for any of them.
    assert!(!tmp.path().join("r").join("peer-0").exists());
}
