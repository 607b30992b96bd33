//! A GPU peer and a CPU peer in one swarm (issue 24): an `atoll run` built with
//! `--features wgpu` trains on `--backend wgpu` beside one training on flex, and both end
//! with bit-identical anchors (the merge stays on the CPU in f32, whatever trains).
//!
//! Needs a Vulkan driver: Debian's `mesa-vulkan-drivers` brings lavapipe, a software one
//! (`.ci/run` installs it). The test builds the wgpu `atoll` itself (into the target dir's
//! `wgpu-test/`, minutes the first time) unless `ATOLL_WGPU_BIN` names one. Without a
//! Vulkan driver it skips and says why, unless `ATOLL_REQUIRE_VULKAN=1` (CI) makes that a
//! failure.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use atoll::fleet::Until;

use common::{assert_same_final_anchors, serial, Peer};

/// The Vulkan driver manifests (ICDs) installed here.
fn vulkan_drivers() -> Vec<PathBuf> {
    ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect()
}

/// An `atoll` with the wgpu backend: `ATOLL_WGPU_BIN`, or built here.
fn wgpu_atoll() -> PathBuf {
    if let Some(bin) = std::env::var_os("ATOLL_WGPU_BIN") {
        return bin.into();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("wgpu-test");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("building atoll with --features wgpu into {}", target.display());
    let status = std::process::Command::new(cargo)
        .args(["build", "--features", "wgpu", "--bin", "atoll", "--target-dir"])
        .arg(&target)
        .current_dir(root)
        .status()
        .expect("cannot run cargo");
    assert!(status.success(), "cargo build --features wgpu failed: {status}");
    target.join("debug/atoll")
}

#[test]
fn a_wgpu_peer_and_a_cpu_peer_end_with_identical_anchors() {
    let drivers = vulkan_drivers();
    if drivers.is_empty() {
        let why = "no Vulkan driver (install mesa-vulkan-drivers for lavapipe)";
        assert!(std::env::var_os("ATOLL_REQUIRE_VULKAN").is_none(), "{why}");
        eprintln!("skipped: {why}");
        return;
    }
    let exe = wgpu_atoll();
    let _serial = serial();
    let tmp = common::test_dir("gpu-");
    let manifest = common::swarm_manifest(tmp.path(), "gpu-swarm");
    // Both train for the same wall-clock time and stop together: a GPU peer given a step
    // count could finish long before the CPU peer and leave with the anchors of then.
    let until = Until::Seconds(40);
    let spec = |i: usize| {
        let dir = tmp.path().join(format!("peer-{i}"));
        atoll::fleet::Spec::train(dir, &manifest, &format!("{i}/2"), until)
    };
    // The GPU peer listens (it compiles its kernels first); the CPU peer joins it.
    let mut gpu = Peer::start_exe("wgpu peer", spec(0).arg("--backend").arg("wgpu"), &exe);
    let addr = gpu.listen_addr(Duration::from_secs(120));
    let cpu = Peer::start("flex peer", spec(1).bootstrap(Some(addr)));
    let mut peers = [gpu, cpu];
    common::wait_all_exit(&mut peers, Duration::from_secs(300));
    assert_same_final_anchors(&peers);
    let mut ids = Vec::new();
    for (p, backend) in peers.iter().zip(["wgpu", "flex"]) {
        let t = p.training().unwrap();
        assert_eq!(t.backend, backend, "{}", p.name);
        assert!(t.merges >= 3, "{} merged {} rounds", p.name, t.merges);
        ids.push(t.proto_id);
    }
    // The GPU peer's work is in the shared anchors: the CPU peer merged its deltas.
    let merges = atoll::rundir::ledger::read(&peers[1].spec.dir).unwrap();
    let from_gpu = merges
        .iter()
        .flat_map(|m| &m.contributions)
        .filter(|c| c.peer == ids[0] && c.agreement > 0.0)
        .count();
    assert!(from_gpu >= 1, "the CPU peer merged no delta of the GPU peer");
}
