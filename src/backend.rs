//! Which burn backend runs the model. burn 0.22 picks the backend through the `Device`
//! value, so this is the only place that names one; a GPU backend (wgpu, cuda) is one more
//! variant behind a cargo feature.

use burn::tensor::Device;
use serde::{Deserialize, Serialize};

/// A CPU backend compiled into atoll.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// burn-flex: burn's pure-Rust CPU backend (SIMD + rayon). The default: fastest in
    /// `bench/throughput.rs` on this project's model (see bench/RESULTS.md).
    #[default]
    Flex,
    /// burn-ndarray (SIMD + rayon), the backend the project was first specified with.
    Ndarray,
}

impl Backend {
    /// Every backend, for benchmarks and `--help`.
    pub const ALL: [Backend; 2] = [Backend::Flex, Backend::Ndarray];

    /// The plain (inference) device.
    pub fn device(self) -> Device {
        match self {
            Backend::Flex => Device::flex(),
            // burn 0.22 deprecates ndarray in favour of flex; we keep it as the backend the
            // project was specified with, covered by tests/backends.rs.
            #[allow(deprecated)]
            Backend::Ndarray => Device::ndarray(),
        }
    }

    /// The device with autodiff, for training.
    pub fn train_device(self) -> Device {
        self.device().autodiff()
    }

    /// Lower-case name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Flex => "flex",
            Backend::Ndarray => "ndarray",
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| format!("unknown backend {s:?}; choose one of: flex, ndarray"))
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
