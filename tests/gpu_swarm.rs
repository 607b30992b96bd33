//! A GPU peer and a CPU peer in one swarm (issue 24): an `atoll run` on `--backend wgpu`
//! trains beside one on flex, and both end with bit-identical anchors (the merge stays on
//! the CPU in f32, whatever trains).
//!
//! Needs atoll built with `--features wgpu` (the README's test command has it) and a
//! Vulkan driver: Debian's `mesa-vulkan-drivers` brings lavapipe, a software one, which
//! `.ci/run` installs. Without either the test skips and says why, unless
//! `ATOLL_REQUIRE_VULKAN=1` (CI) makes that a failure.

mod common;

/// Why the GPU peer cannot run here, if it cannot.
fn missing() -> Option<String> {
    #[cfg(not(feature = "wgpu"))]
    return Some("atoll was built without --features wgpu".into());
    #[cfg(feature = "wgpu")]
    atoll::backend::Backend::Wgpu.check().err()
}

#[test]
fn a_wgpu_peer_and_a_cpu_peer_end_with_identical_anchors() {
    if let Some(why) = missing() {
        assert!(std::env::var_os("ATOLL_REQUIRE_VULKAN").is_none(), "{why}");
        eprintln!("skipped: {why}");
        return;
    }
    #[cfg(feature = "wgpu")]
    mixed::swarm();
}

#[cfg(feature = "wgpu")]
mod mixed {
    use std::time::Duration;

    use atoll::fleet::{Spec, Until};

    use super::common::{self, assert_same_final_anchors, serial, Peer};

    pub fn swarm() {
        let _serial = serial();
        let tmp = common::test_dir("gpu-");
        let manifest = common::swarm_manifest(tmp.path(), "gpu-swarm");
        // Both train for the same wall-clock time and stop together: a GPU peer given a
        // step count could finish long before the CPU peer and leave with the anchors of
        // then.
        let until = Until::Seconds(60);
        let spec = |i: usize| {
            let dir = tmp.path().join(format!("peer-{i}"));
            Spec::train(dir, &manifest, &format!("{i}/2"), until)
        };
        // Lavapipe compiles the model's kernels during a peer's first step: over a minute on
        // a 2-core machine with a cold shader cache (CI machines start with one), longer
        // than the run, and the GPU peer then contributes nothing. A one-step peer of the
        // same model fills Mesa's on-disk shader cache first, so the swarm's GPU peer trains
        // within seconds of starting, as a restarted peer on a real GPU does (JOINING.md).
        let warm = Spec::train(tmp.path().join("warm-up"), &manifest, "0/2", Until::Steps(1));
        let mut warm = [Peer::start("wgpu warm-up", warm.arg("--backend").arg("wgpu"))];
        common::wait_all_exit(&mut warm, Duration::from_secs(300));
        // The GPU peer listens; the CPU peer joins it.
        let mut gpu = Peer::start("wgpu peer", spec(0).arg("--backend").arg("wgpu"));
        let addr = gpu.listen_addr(Duration::from_secs(120));
        let cpu = Peer::start("flex peer", spec(1).bootstrap(Some(addr)));
        let mut peers = [gpu, cpu];
        common::wait_all_exit(&mut peers, Duration::from_secs(300));
        assert_same_final_anchors(&peers);
        let mut ids = Vec::new();
        for (p, backend) in peers.iter().zip(["wgpu", "flex"]) {
            let t = p.training().unwrap();
            assert_eq!(t.backend, backend, "{}", p.name);
            // On a loaded machine lavapipe's first step (kernel compilation) can take half
            // the run, and the GPU peer then takes the rounds it missed as adopted states.
            assert!(
                t.step >= 1 && t.merges + t.adopted >= 3,
                "{}: {} steps, {} merges, {} adopted",
                p.name,
                t.step,
                t.merges,
                t.adopted
            );
            ids.push(t.proto_id);
        }
        // The GPU peer's work is in the shared anchors: the CPU peer merged its deltas.
        let merges = atoll::rundir::ledger::read(&peers[1].spec.dir).unwrap();
        let from_gpu: Vec<_> =
            merges.iter().flat_map(|m| &m.contributions).filter(|c| c.peer == ids[0]).collect();
        assert!(
            from_gpu.iter().any(|c| c.agreement > 0.0),
            "the CPU peer merged no delta of the GPU peer with weight: {from_gpu:?}; GPU peer {:?}",
            peers[0].training()
        );
    }
}
