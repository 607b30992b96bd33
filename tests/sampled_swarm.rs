//! A swarm of real `atoll run` processes on 127.0.0.1 whose manifest samples contributions
//! (`protocol.contributors` 2 of 6 peers): after the first merge each peer publishes a
//! fragment's delta every second or third round, banks the rounds between (keeping its
//! residual on disk), and the swarm still ends on bit-identical anchors.

mod common;

use std::time::Duration;

use atoll::fleet::Until;
use atoll::rundir::status;
use atoll::train::TrainConfig;

use common::{assert_same_final_anchors, serial, swarm_of, wait_all_exit};

#[test]
fn a_sampled_swarm_publishes_every_other_round_and_agrees() {
    let _serial = serial();
    let tmp = common::test_dir("sampled-");
    let mut train = TrainConfig::tiny(11);
    train.val_every = 100;
    train.schedule.decay_steps = 2_000;
    let mut m = common::tiny_manifest("sampled-swarm", train);
    m.protocol.contributors = 2;
    m.epoch_unix_ms = status::unix_ms();
    let manifest = common::write_manifest(tmp.path().join("manifest-in.json"), &m);
    let steps = common::steps_for(Duration::from_secs(12));
    let until = [Until::Steps(steps); 6];
    let mut peers = swarm_of(tmp.path(), &manifest, &until, |_, s| s);
    let deadline = common::deadline_for(steps, peers.len());
    // Six contributing peers, two wanted a round: every fragment's period becomes 3, or 2
    // where late deltas make the swarm look smaller (while they train; once they stop,
    // merges thin out and so does the estimate).
    let sampled = peers[0].wait_until("period 2+", deadline, |t| {
        !t.period.is_empty() && t.period.iter().all(|&k| k >= 2)
    });
    assert!(!sampled.trained, "peer 0 finished training before its periods reached 2");
    wait_all_exit(&mut peers, deadline);
    assert_same_final_anchors(&peers);
    let (mut published, mut banked) = (0, 0);
    for p in &peers {
        let s = p.status().unwrap();
        let t = s.training.as_ref().unwrap();
        assert!(t.merges >= 4, "{}: merged {} rounds", p.name, t.merges);
        // All-to-all banks nothing; every sampled peer banks some of its snapshots.
        assert!(t.published > 0 && t.banked > 0, "{}: {t:?}", p.name);
        published += t.published;
        banked += t.banked;
        for f in 0..t.round.len() {
            let path = p.spec.dir.join(format!("anchors/fragment-{f}.residual"));
            assert!(path.exists(), "{}: no {}", p.name, path.display());
        }
    }
    // At period k, k − 1 of every k snapshots are banked rather than published, but the
    // period is 1 before the first merge, and on 2 busy cores most rounds merge only part of
    // the swarm's deltas on time, so the estimate and with it the period wander. With 3 of 6
    // wanted (period 2 at best) the swarm banked 0.64–1.5 per published in most of 21 local
    // runs, 0.10–0.42 in eight (under a parallel build), and the period sometimes never
    // reached 2 on every fragment: hence 2 of 6. A fifth is the floor: sampling that barely
    // acts fails it.
    assert!(
        5 * banked >= published,
        "{published} published, {banked} banked over the swarm: sampling barely acted"
    );
}
