//! Late join: a fresh peer given only one bootstrap address, started after the swarm has
//! merged for a while, takes the swarm's current anchors before its first inner step, then
//! trains and contributes, and the swarm ends in agreement.

mod common;

use std::time::Duration;

use common::{Peer, Spec, Until};

#[test]
fn a_late_joiner_takes_the_swarms_anchors_before_its_first_step() {
    let _serial = common::serial();
    let tmp = common::test_dir("late-join-");
    // The swarm trains on past twenty rounds (4 s), the late start and five more merges.
    let steps = common::steps_for(Duration::from_secs(20));
    let mut peers = common::swarm(tmp.path(), "late-join", &[steps, steps]);
    let min_round = |t: &atoll::rundir::status::TrainingStatus| t.round.iter().copied().min();
    for p in &mut peers {
        p.wait_until("20 rounds merged", Duration::from_secs(60), |t| {
            t.merges >= 20 && min_round(t).unwrap_or(0) >= 10
        });
    }
    let swarm_round = min_round(&peers[1].training().unwrap()).unwrap();
    let addr = peers[1].listen_addr(Duration::from_secs(5));
    let manifest = tmp.path().join("manifest-in.json");
    let spec = Spec::train(tmp.path().join("peer-late"), &manifest, "2/3", Until::Steps(400))
        .bootstrap(Some(addr));
    let mut late = Peer::start("late peer", spec);
    let t = late.wait_until("first inner step", Duration::from_secs(30), |t| t.step > 0);
    let join_ms = t.join_ms.expect("the first step sets join_ms");
    assert!(
        t.join_rounds.iter().all(|&r| r + 1 >= swarm_round),
        "started training at rounds {:?} while the swarm was at round {swarm_round}\n{}",
        t.join_rounds,
        late.log_tail()
    );
    eprintln!("late joiner: first step after {join_ms} ms at rounds {:?}", t.join_rounds);
    let merged = t.merges;
    late.wait_until("training and merging", Duration::from_secs(60), |t| {
        t.step >= 200 && t.merges >= merged + 5
    });
    for p in &mut peers {
        p.assert_alive();
    }
    peers.push(late);
    let deadline = common::deadline_for(steps, peers.len());
    common::wait_all_exit(&mut peers, deadline);
    common::assert_same_final_anchors(&peers);
}
