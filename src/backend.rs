//! Which burn backend runs the model. burn 0.22 picks the backend through the `Device`
//! value, so this is the only place that names one. The GPU backend is a cargo feature
//! (`--features wgpu`); the merge never runs on it: anchors, deltas
//! and the outer step stay f32 vectors on the CPU in a fixed order, so peers on different
//! backends end a run with bit-identical anchors.

use burn::tensor::Device;
use serde::{Deserialize, Serialize};

/// A backend atoll can train on. The CPU ones are always compiled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// burn-flex: burn's pure-Rust CPU backend (SIMD + rayon). The default: fastest in
    /// `bench/throughput.rs` on this project's model (see bench/RESULTS.md).
    #[default]
    Flex,
    /// burn-ndarray (SIMD + rayon), the backend the project was first specified with.
    Ndarray,
    /// burn-wgpu on the machine's default adapter: Vulkan (SPIR-V kernels), Metal or DX12,
    /// NVIDIA, AMD and Intel GPUs alike; a software Vulkan driver (lavapipe) works too.
    /// Cargo feature `wgpu`.
    #[cfg(feature = "wgpu")]
    Wgpu,
}

/// Every backend name atoll knows, with the cargo feature that compiles it in.
const KNOWN: [(&str, Option<&str>); 3] =
    [("flex", None), ("ndarray", None), ("wgpu", Some("wgpu"))];

impl Backend {
    /// Every backend compiled into this build, for benchmarks and `--help`.
    pub fn all() -> Vec<Backend> {
        #[allow(unused_mut)]
        let mut all = vec![Backend::Flex, Backend::Ndarray];
        #[cfg(feature = "wgpu")]
        all.push(Backend::Wgpu);
        all
    }

    /// The compiled-in backends that pass [`Backend::check`] on this machine.
    pub fn usable() -> Vec<Backend> {
        Backend::all().into_iter().filter(|b| b.check().is_ok()).collect()
    }

    /// The plain (inference) device.
    pub fn device(self) -> Device {
        match self {
            Backend::Flex => Device::flex(),
            // burn 0.22 deprecates ndarray in favour of flex; we keep it as the backend the
            // project was specified with, covered by tests/library/backends.rs.
            #[allow(deprecated)]
            Backend::Ndarray => Device::ndarray(),
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
        }
    }

    /// The device with autodiff, for training.
    pub fn train_device(self) -> Device {
        self.device().autodiff()
    }

    /// Whether the model runs on a GPU (so the CPU's cores are free for the network).
    pub fn is_gpu(self) -> bool {
        !matches!(self, Backend::Flex | Backend::Ndarray)
    }

    /// Checks that the backend can run here, by computing one small sum on it. A GPU
    /// backend on a machine without a usable device (no driver, no adapter) panics inside
    /// burn on first use; this turns that into an error before a peer joins a swarm.
    pub fn check(self) -> Result<(), String> {
        let device = self.device();
        let probe = std::panic::AssertUnwindSafe(|| {
            burn::tensor::Tensor::<1>::ones([4], &device).sum().into_scalar::<f32>()
        });
        match std::panic::catch_unwind(probe) {
            Ok(4.0) => Ok(()),
            Ok(sum) => Err(format!("backend {self} computed 1+1+1+1 = {sum}")),
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("unknown reason");
                Err(format!("backend {self} cannot run on this machine: {why}"))
            }
        }
    }

    /// Lower-case name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Flex => "flex",
            Backend::Ndarray => "ndarray",
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => "wgpu",
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(b) = Backend::all().into_iter().find(|b| b.name() == s) {
            return Ok(b);
        }
        match KNOWN.iter().find(|(name, _)| *name == s) {
            Some((_, Some(feature))) => Err(format!(
                "backend {s:?} is not compiled into this atoll; build it with \
                 `cargo build --release --features {feature}`"
            )),
            _ => {
                let names: Vec<&str> = KNOWN.iter().map(|(name, _)| *name).collect();
                Err(format!("unknown backend {s:?}; choose one of: {}", names.join(", ")))
            }
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_missing_features_are_named() {
        for b in Backend::all() {
            assert_eq!(b.name().parse::<Backend>(), Ok(b));
        }
        let err = "tpu".parse::<Backend>().unwrap_err();
        assert!(err.contains("unknown backend") && err.contains("flex"), "{err}");
        #[cfg(not(feature = "wgpu"))]
        {
            let err = "wgpu".parse::<Backend>().unwrap_err();
            assert!(err.contains("--features wgpu"), "{err}");
        }
    }

    #[test]
    fn the_cpu_backends_pass_their_check() {
        assert_eq!(Backend::Flex.check(), Ok(()));
        assert!(!Backend::Flex.is_gpu());
    }
}
