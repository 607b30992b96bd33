//! A training swarm under churn, with real `atoll run` processes on 127.0.0.1: a peer
//! that leaves on SIGTERM, one that is killed and restarted on its run dir, and one that
//! stalls (SIGSTOP) for several rounds. The tiny model and 200 ms rounds keep each test to
//! seconds; the tests take turns (one lock) so their timings do not depend on each other.
//! Step counts are least durations under the tests' step floor (`common::steps_for`), so
//! no scenario depends on how fast the CPU trains.

mod common;

use std::time::{Duration, Instant};

use atoll::rundir::status::{self, TrainingStatus};

use common::{assert_same_final_anchors, serial, swarm, wait_all_exit, Peer, POLL};

#[test]
fn sigterm_leaves_at_a_step_boundary_with_a_checkpoint_and_the_swarm_goes_on() {
    let _serial = serial();
    let tmp = common::test_dir("churn-");
    let mut peers = swarm(tmp.path(), "churn-leave", &[100_000, 100_000]);
    peers[1].wait_until("step 100", Duration::from_secs(60), |t| t.step >= 100);
    peers[0].wait_until("a merge", Duration::from_secs(20), |t| t.merges >= 1);

    peers[1].signal("-TERM");
    let exit = peers[1].wait_exit(Duration::from_secs(10));
    assert!(exit.success(), "peer 1 exited with {exit} on SIGTERM\n{}", peers[1].log_tail());
    let left = peers[1].status().expect("peer 1 left no status.json");
    assert!(!left.running, "peer 1 still says running=true after exiting");
    let left_step = left.training.as_ref().unwrap().step;
    assert!(left_step >= 100, "peer 1 status step {left_step}");
    // The leaver closed its connections: the swarm knows at once, not after a timeout.
    let leaver = left.stats.peer_id.clone();
    common::wait_for("peer 0 to drop the leaver", Duration::from_secs(3), &mut peers[..1], |p| {
        !p[0].run_peers().contains(&leaver)
    });
    let ckpt = atoll::checkpoint::load(&atoll::checkpoint::path_in(&peers[1].spec.dir))
        .expect("peer 1's checkpoint does not load");
    assert!(ckpt.meta.state.step >= 100, "checkpoint at step {}", ckpt.meta.state.step);
    assert_eq!(
        ckpt.meta.state.step, left_step,
        "the checkpoint is not of the step the peer left at"
    );

    // Peer 0 goes on training (and keeps its round clock) alone.
    let before = peers[0].training().unwrap();
    let max_round = |t: &TrainingStatus| t.round.iter().copied().max().unwrap_or(0);
    peers[0].wait_until("training and merging alone", Duration::from_secs(20), |t| {
        t.step >= before.step + 100
            && max_round(t) >= max_round(&before) + 5
            && t.merges >= before.merges + 4
    });
    peers[0].assert_alive();
}

#[test]
fn a_killed_peer_restarts_from_its_run_dir_and_the_swarm_ends_in_agreement() {
    let _serial = serial();
    let tmp = common::test_dir("churn-");
    // Peers 0 and 1 train through the kill, the restart and two merges after it: seconds.
    let steps = common::steps_for(Duration::from_secs(15));
    let mut peers = swarm(tmp.path(), "churn-crash", &[steps, steps, steps]);
    let before =
        peers[2].wait_until("2 merges", Duration::from_secs(60), |t| t.merges >= 2 && t.step >= 60);
    let id_before = peers[2].status().unwrap().stats.peer_id;

    peers[2].kill();
    let ckpt = atoll::checkpoint::load(&atoll::checkpoint::path_in(&peers[2].spec.dir))
        .expect("the killed peer's checkpoint does not load");
    let ckpt_step = ckpt.meta.state.step;
    assert!(ckpt_step > 0, "no checkpoint step");
    assert!(ckpt_step <= before.step + 50, "checkpoint {ckpt_step} after {} steps", before.step);
    // The status file of the killed process (still running=true) must not be mistaken for
    // the restarted one's.
    std::fs::remove_file(peers[2].spec.dir.join(status::FILE_NAME)).unwrap();
    let residuals = saved_residual_norms(&peers[2].spec.dir);
    assert!(!residuals.is_empty(), "the killed peer saved no error-feedback residual");
    assert!(residuals.iter().any(|n| *n > 0.0), "every saved residual is zero: {residuals:?}");

    let spec = peers[2].spec.clone();
    peers[2] = Peer::start("peer 2 (restarted)", spec);
    let first = peers[2].wait_until("a status", Duration::from_secs(30), |_| true);
    // It continues the residuals it saved before the kill (the log names their norms).
    let norms: Vec<String> = residuals.iter().map(|n| format!("{n:e}")).collect();
    let line = format!("fragments={} norms={}", residuals.len(), norms.join(","));
    let log = peers[2].log();
    assert!(
        log.lines()
            .any(|l| l.contains("continuing the error-feedback residuals") && l.contains(&line)),
        "the restarted peer did not continue its residuals ({line})\n{}",
        peers[2].log_tail()
    );
    assert!(
        first.step >= ckpt_step,
        "the restarted peer reports step {} before its checkpoint's {ckpt_step}",
        first.step
    );
    let again = peers[2].status().unwrap();
    assert_eq!(again.stats.peer_id, id_before, "the restarted peer has another peer id");
    // It contributes again: merges after the restart (the counter starts over).
    let t = peers[2].wait_until("2 merges after restart", Duration::from_secs(30), |t| {
        t.merges >= 2 && t.step > ckpt_step
    });
    assert!(t.step > ckpt_step);
    for p in &mut peers[..2] {
        p.assert_alive();
    }

    wait_all_exit(&mut peers, common::deadline_for(steps, 3));
    assert_same_final_anchors(&peers);
}

/// Norms of the error-feedback residuals saved in a run dir, by fragment (the file's f32
/// body, checked against its trailing blake3).
fn saved_residual_norms(dir: &std::path::Path) -> Vec<f32> {
    let mut norms = Vec::new();
    for p in 0.. {
        let f = dir.join(format!("anchors/fragment-{p}.residual"));
        let Ok(bytes) = std::fs::read(&f) else { break };
        let (body, sum) = bytes.split_at(bytes.len() - 32);
        assert_eq!(blake3::hash(body).as_bytes(), sum, "{} is corrupt", f.display());
        let values: Vec<f32> =
            body.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        norms.push(atoll::delta::l2_norm(&values));
    }
    norms
}

#[test]
fn a_stalled_peer_does_not_stop_the_others_and_catches_up() {
    let _serial = serial();
    let tmp = common::test_dir("churn-");
    // Peers 0 and 1 must still train when the checks after the stall end: start-up, two
    // merges, the 2 s stall and up to 2 s of checks.
    let steps = common::steps_for(Duration::from_secs(20));
    let mut peers = swarm(tmp.path(), "churn-straggler", &[steps, steps, steps]);
    peers[2].wait_until("2 merges", Duration::from_secs(60), |t| t.merges >= 2);
    for p in &mut peers[..2] {
        p.wait_until("2 merges", Duration::from_secs(20), |t| t.merges >= 2);
    }

    peers[2].signal("-STOP");
    let stopped = Instant::now();
    // The least advanced fragment's round.
    let rounds = |p: &Peer| p.training().map(|t| t.round.iter().copied().min().unwrap_or(0));
    let r0: Vec<u64> = peers[..2].iter().map(|p| rounds(p).unwrap()).collect();
    let m0: Vec<u64> = peers[..2].iter().map(|p| p.training().unwrap().merges).collect();
    let stalled = peers[2].training().unwrap();
    // Two seconds stopped: ten periods of 200 ms.
    while stopped.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(POLL);
    }
    // Status files are rewritten every 500 ms.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let r1: Vec<u64> = peers[..2].iter().map(|p| rounds(p).unwrap()).collect();
        if r1.iter().zip(&r0).all(|(a, b)| a >= &(b + 3)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rounds {r0:?} → {r1:?} while peer 2 was stopped; statuses {:?} {:?}\n{}\n{}",
            peers[0].training(),
            peers[1].training(),
            peers[0].log_tail(),
            peers[1].log_tail()
        );
        std::thread::sleep(POLL);
    }
    for (i, p) in peers[..2].iter_mut().enumerate() {
        p.assert_alive();
        let m = p.training().unwrap().merges;
        assert!(m >= m0[i] + 3, "peer {i} merged {} → {m} while peer 2 was stopped", m0[i]);
    }
    assert_eq!(peers[2].training().unwrap().step, stalled.step, "peer 2 was not stopped");
    for p in &peers[..2] {
        let t = p.training().unwrap();
        assert!(!t.trained, "{} finished training during the stall; give more steps", p.name);
    }
    peers[2].signal("-CONT");
    peers[2].wait_until("training again", Duration::from_secs(10), |t| t.step > stalled.step);

    wait_all_exit(&mut peers, common::deadline_for(steps, 3));
    assert_same_final_anchors(&peers);
}
