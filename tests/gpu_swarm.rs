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
    use std::time::{Duration, Instant};

    use atoll::fleet::{Spec, Until};

    use super::common::{self, assert_same_final_anchors, serial, Peer};

    /// How long the GPU peer trains (`--duration`), its first step included.
    const RUN: u64 = 150;
    /// The least time the two peers train together.
    const TOGETHER: u64 = 30;

    pub fn swarm() {
        let _serial = serial();
        let tmp = common::test_dir("gpu-");
        let manifest = common::swarm_manifest(tmp.path(), "gpu-swarm");
        // Both stop training at the same wall-clock time (a GPU peer given a step count
        // could finish long before the CPU peer, or after it had left).
        let spec = |i: usize, until: Until| {
            let dir = tmp.path().join(format!("peer-{i}"));
            Spec::train(dir, &manifest, &format!("{i}/2"), until)
        };
        // Lavapipe compiles the model's kernels during a peer's first step: 40–85 s on a
        // 2-core machine (with Mesa's shader cache warm or cold), most of a short run, and
        // a GPU peer that spent its run compiling contributes nothing (a CI run: one step,
        // no delta, in 60 s). So the GPU peer starts first, alone, and the CPU peer joins
        // once its first step is done and trains until the GPU peer's time is up.
        let started = Instant::now();
        let mut gpu =
            [Peer::start("wgpu peer", spec(0, Until::Seconds(RUN)).arg("--backend").arg("wgpu"))];
        let addr = gpu[0].listen_addr(Duration::from_secs(120));
        common::wait_for(
            "the GPU peer's first step",
            Duration::from_secs(RUN - TOGETHER),
            &mut gpu,
            |p| p[0].training().is_some_and(|t| t.step >= 1),
        );
        eprintln!("the GPU peer's first step was done {:?} after its start", started.elapsed());
        let left = RUN.saturating_sub(started.elapsed().as_secs()).max(TOGETHER);
        let [gpu] = gpu;
        let cpu = Peer::start("flex peer", spec(1, Until::Seconds(left)).bootstrap(Some(addr)));
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
        let weighed = from_gpu.iter().filter(|c| c.agreement > 0.0).count();
        eprintln!(
            "the CPU peer merged {} deltas of the GPU peer, {weighed} with weight",
            from_gpu.len()
        );
        assert!(
            weighed > 0,
            "the CPU peer merged no delta of the GPU peer with weight: {from_gpu:?}; GPU peer {:?}",
            peers[0].training()
        );
    }
}
