//! The product end to end: `atoll demo` starts real `atoll run` processes that train on
//! the embedded corpus, gossip deltas over libp2p on 127.0.0.1 and merge them with no
//! leader. A tiny model and a short period keep it to seconds; the default model's numbers
//! are in bench/RESULTS.md.

mod common;

use atoll::train::TrainConfig;

fn tiny_manifest(dir: &std::path::Path) -> std::path::PathBuf {
    let mut train = TrainConfig::tiny(5);
    train.val_every = 20;
    train.schedule.decay_steps = 200;
    // Rounds of 200 ms: many merges within the run.
    common::write_manifest(dir.join("tiny.json"), &common::tiny_manifest("demo-test", train))
}

#[test]
fn three_peers_train_merge_and_end_with_identical_anchors() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tiny_manifest(tmp.path());
    let run_dir = tmp.path().join("demo");
    // Each step in passes of one row (the tiny model's batch has four): a peer's own
    // choice, which leaves the merges, and so the anchors, as they would be.
    let args = ["demo", "--peers", "3", "--steps", "200", "--timeout", "240", "--micro-batch", "1"];
    let pace = common::pace_flags();
    let args: Vec<&str> = args.into_iter().chain(pace.iter().map(String::as_str)).collect();
    common::run_swarm_command(&args, &run_dir, &config);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["anchors_agree"], true, "{summary:#}");
    let peers = summary["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 3);
    for p in peers {
        assert_eq!(p["steps"], 200, "{p:#}");
        let bpb = p["final_val_bpb"].as_f64().unwrap();
        // The tiny model starts at 8 bits per byte (uniform over 256).
        assert!(bpb < 7.0, "final val_bpb {bpb}");
        assert!(p["bytes_sent"].as_u64().unwrap() > 0);
        assert_eq!(p["anchor_hashes"].as_array().unwrap().len(), 4);
    }
    // The anchors moved away from the initial parameters: merges happened on every peer.
    for i in 0..3 {
        let status: serde_json::Value = serde_json::from_slice(
            &std::fs::read(run_dir.join(format!("peer-{i}/status.json"))).unwrap(),
        )
        .unwrap();
        let merges = status["training"]["merges"].as_u64().unwrap();
        assert!(merges >= 4, "peer {i} merged {merges} rounds");
        // Every peer got the step floor (`demo --min-step-ms`).
        let log = std::fs::read_to_string(run_dir.join(format!("peer-{i}/peer.log"))).unwrap();
        let floor = format!("steps of at least {} ms", common::STEP_MS);
        assert!(log.contains(&floor), "peer {i} does not report its step floor");
        assert!(log.contains("micro_batch=1"), "peer {i} does not report its passes");
        assert_eq!(status["running"], false);
    }
    assert!(summary["consensus_distance"].as_f64().unwrap() < 1e-6, "{summary:#}");
    // The pace the summary reports: at most one step per `STEP_MS` in each 200 ms period
    // (h 10 × 20 ms), and some steps in each.
    let pace = summary["steps_per_period"].as_f64().unwrap();
    let most = 200.0 / common::STEP_MS as f64;
    assert!(pace > 0.5 && pace <= most * 1.1, "{pace} steps per period, at most {most}");
    assert_eq!(summary["h"], 10, "{summary:#}");
}
