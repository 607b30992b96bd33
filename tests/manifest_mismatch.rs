//! Two real peers under one swarm name whose manifests differ: each refuses the other's
//! messages, counts them, and logs which manifest fields differ.

mod common;

use std::time::Duration;

use atoll::train::TrainConfig;

use common::{tiny_manifest, wait_for, write_manifest, Peer, Spec, Until};

const DEADLINE: Duration = Duration::from_secs(40);

#[test]
fn peers_with_different_manifests_refuse_each_other_and_say_why() {
    let tmp = common::test_dir("mismatch-");
    let a = tiny_manifest("mismatch-test", TrainConfig::tiny(1));
    let mut b = a.clone();
    b.train.batch = 6;
    let pa = write_manifest(tmp.path().join("a.json"), &a);
    let pb = write_manifest(tmp.path().join("b.json"), &b);

    let spec = |name: &str, manifest| {
        Spec::train(tmp.path().join(name), manifest, "0/1", Until::Seconds(60))
    };
    let mut first = Peer::start("a", spec("a", &pa));
    let addr = first.listen_addr(DEADLINE);
    let second = Peer::start("b", spec("b", &pb).bootstrap(Some(addr)));
    let mut peers = [first, second];
    for i in 0..2 {
        wait_for("refused foreign messages", DEADLINE, &mut peers, |p| {
            p[i].training().is_some_and(|t| t.foreign_messages > 0)
        });
        wait_for("a log line naming the differing field", DEADLINE, &mut peers, |p| {
            p[i].log().contains("train.batch")
        });
    }
    // Refusing is not failing: both are still training.
    for p in &peers {
        let s = p.status().unwrap();
        assert!(s.running, "{} is not running: {s:?}", p.name);
    }
}

/// `--model`, `--activation` and `--optimizer` name the model of a new run: a run dir that holds a run
/// of another model is refused with the reason, before the peer joins anything.
#[test]
fn a_run_dir_of_another_model_refuses_a_preset() {
    let tmp = common::test_dir("preset-");
    let dir = tmp.path().join("peer");
    std::fs::create_dir_all(&dir).unwrap();
    write_manifest(
        dir.join(atoll::manifest::FILE_NAME),
        &tiny_manifest("preset", TrainConfig::tiny(1)),
    );
    let refused = |flags: &[&str], reason: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_atoll"))
            .arg("run")
            .args(flags)
            .args(["--steps", "1", "--listen", "/ip4/127.0.0.1/tcp/0"])
            .arg("--run-dir")
            .arg(&dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "started anyway: {stderr}");
        assert!(stderr.contains(reason), "{stderr}");
    };
    refused(&["--model", "small"], "--model small applies to a new run only");
    refused(&["--activation", "hard-swish"], "--activation hard-swish applies to a new run only");
    refused(&["--optimizer", "adamw"], "--optimizer adamw applies to a new run only");
}
