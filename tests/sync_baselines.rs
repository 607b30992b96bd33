//! The synchronous baselines as real processes over atoll-net (`atoll run --method
//! dp|diloco`): a group of two forms, trains the tiny model in lockstep and ends with the
//! same parameters on both peers, its bytes counted on the wire; a peer of a strict group
//! whose partner never comes says so and exits non-zero.

mod common;

use std::time::Duration;

use common::{Peer, Spec, Until};

fn group_of_two(method: &str) {
    let _serial = common::serial();
    let tmp = common::test_dir(&format!("sync-{method}-"));
    let manifest = common::swarm_manifest(tmp.path(), &format!("sync-{method}"));
    let spec = |i: u32| {
        Spec::train(
            tmp.path().join(format!("peer-{i}")),
            &manifest,
            &format!("{i}/2"),
            Until::Steps(30),
        )
        .arg("--method")
        .arg(method)
        .arg("--group")
        .arg("2")
    };
    let mut first = Peer::start("peer 0", spec(0));
    let addr = first.listen_addr(Duration::from_secs(30));
    let mut second = Peer::start("peer 1", spec(1).bootstrap(Some(addr)));
    for p in [&mut first, &mut second] {
        let exit = p.wait_exit(Duration::from_secs(120));
        assert!(exit.success(), "{} failed ({exit})\n{}", p.name, p.log_tail());
    }
    let (a, b) = (first.training().unwrap(), second.training().unwrap());
    assert_eq!(a.step, 30);
    assert!(a.final_val_bpb.is_some_and(f64::is_finite));
    assert_eq!(a.anchor_hashes, b.anchor_hashes, "the group's peers ended on different parameters");
    let sent = first.status().unwrap().stats.bytes_sent;
    assert!(sent > 0, "no bytes counted");
    eprintln!(
        "{method}: final val_bpb {:.3}, {sent} bytes sent by peer 0",
        a.final_val_bpb.unwrap()
    );
}

#[test]
fn data_parallel_peers_train_in_lockstep() {
    group_of_two("dp");
}

#[test]
fn synchronous_diloco_peers_agree_after_every_outer_step() {
    group_of_two("diloco");
}

#[test]
fn a_strict_group_that_never_forms_is_a_clear_error() {
    let _serial = common::serial();
    let tmp = common::test_dir("sync-alone-");
    let manifest = common::swarm_manifest(tmp.path(), "sync-alone");
    let spec = Spec::train(tmp.path().join("peer-0"), &manifest, "0/2", Until::Steps(30))
        .arg("--method")
        .arg("dp")
        .arg("--group")
        .arg("2")
        .arg("--barrier-timeout")
        .arg("2");
    let mut alone = Peer::start("peer 0", spec);
    let exit = alone.wait_exit(Duration::from_secs(60));
    assert!(!exit.success(), "a group of one out of two trained anyway");
    let log = alone.log();
    assert!(log.contains("only 0 of the other 1 peers joined"), "{}", alone.log_tail());
}

/// `--min-step-ms` paces a baseline's inner steps too (`bench/p3.sh` relies on it for a
/// step rate that survivors of a kill do not gain on): 20 steps of at least 150 ms take at
/// least 3 s of training, where the tiny model's steps alone take a few ms each.
#[test]
fn a_paced_member_takes_at_least_its_floor_per_step() {
    let _serial = common::serial();
    let tmp = common::test_dir("sync-paced-");
    let manifest = common::swarm_manifest(tmp.path(), "sync-paced");
    let dir = tmp.path().join("peer-0");
    let spec = Spec::train(dir.clone(), &manifest, "0/1", Until::Steps(20))
        .arg("--method")
        .arg("dp")
        .arg("--group")
        .arg("1")
        .arg("--min-step-ms")
        .arg("150");
    let mut alone = Peer::start("peer 0", spec);
    let exit = alone.wait_exit(Duration::from_secs(60));
    assert!(exit.success(), "the paced member failed ({exit})\n{}", alone.log_tail());
    let metrics = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let last: serde_json::Value =
        serde_json::from_str(metrics.lines().last().expect("no metrics")).unwrap();
    let (tokens, rate) = (last["tokens"].as_f64().unwrap(), last["tokens_per_s"].as_f64().unwrap());
    assert_eq!(last["step"], 20, "{last}");
    let secs = tokens / rate;
    assert!(secs >= 3.0, "20 paced steps took {secs:.2} s of training, under 20 × 150 ms");
}

/// Members stop after the same mean, but a member that fetched faster must not leave
/// while a slower one still fetches its buffer: under a tight upload cap (three members,
/// each buffer served to two others at 1 Mbit/s), every member ends on the same
/// parameters and none fails at the last step (`Group::finish`).
#[test]
fn a_capped_group_ends_together() {
    let _serial = common::serial();
    let tmp = common::test_dir("sync-capped-");
    let manifest = common::swarm_manifest(tmp.path(), "sync-capped");
    let spec = |i: u32| {
        Spec::train(
            tmp.path().join(format!("peer-{i}")),
            &manifest,
            &format!("{i}/3"),
            Until::Steps(4),
        )
        .arg("--method")
        .arg("dp")
        .arg("--group")
        .arg("3")
        .arg("--max-upload-mbps")
        .arg("1")
    };
    let mut first = Peer::start("peer 0", spec(0));
    let addr = first.listen_addr(Duration::from_secs(30));
    let mut peers = vec![first];
    for i in 1..3 {
        peers.push(Peer::start(&format!("peer {i}"), spec(i).bootstrap(Some(addr.clone()))));
    }
    for p in &mut peers {
        let exit = p.wait_exit(Duration::from_secs(180));
        assert!(exit.success(), "{} failed ({exit})\n{}", p.name, p.log_tail());
    }
    let hashes: Vec<_> = peers.iter().map(|p| p.training().unwrap().anchor_hashes).collect();
    assert!(hashes.windows(2).all(|w| w[0] == w[1]), "members ended apart: {hashes:?}");
    assert_eq!(peers[0].training().unwrap().step, 4);
}
