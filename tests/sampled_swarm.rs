//! A swarm of real `atoll run` processes on 127.0.0.1 whose manifest samples contributions
//! (`protocol.contributors` 3 of 6 peers): after the first merge each peer publishes a
//! fragment's delta every other round, banks the round between (keeping its residual on
//! disk), and the swarm still ends on bit-identical anchors.

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
    m.protocol.contributors = 3;
    m.epoch_unix_ms = status::unix_ms();
    let manifest = common::write_manifest(tmp.path().join("manifest-in.json"), &m);
    let steps = common::steps_for(Duration::from_secs(12));
    let until = [Until::Steps(steps); 6];
    let mut peers = swarm_of(tmp.path(), &manifest, &until, |_, s| s);
    // Six contributing peers, three wanted a round: every fragment's period becomes 2
    // (while they train; once they stop, merges thin out and so does the estimate).
    let sampled = peers[0].wait_until("period 2", common::deadline_for(steps), |t| {
        !t.period.is_empty() && t.period.iter().all(|&k| k == 2)
    });
    assert!(!sampled.trained, "peer 0 finished training before its period reached 2");
    wait_all_exit(&mut peers, common::deadline_for(steps));
    assert_same_final_anchors(&peers);
    for p in &peers {
        let s = p.status().unwrap();
        let t = s.training.as_ref().unwrap();
        assert!(t.merges >= 4, "{}: merged {} rounds", p.name, t.merges);
        // At period 2 every other snapshot is banked rather than published; the period is
        // 1 before the first merge and may fall back while rounds are skipped or after
        // training stops (measured: 291 published / 254 banked on an idle machine, 344 /
        // 103 under CI), so only a sizeable share is asserted. All-to-all banks none.
        assert!(t.published > 0 && t.banked > 0, "{}: {t:?}", p.name);
        assert!(
            5 * t.banked >= t.published,
            "{}: {} published, {} banked: sampling barely acted",
            p.name,
            t.published,
            t.banked
        );
        for f in 0..t.round.len() {
            let path = p.spec.dir.join(format!("anchors/fragment-{f}.residual"));
            assert!(path.exists(), "{}: no {}", p.name, path.display());
        }
    }
}
