//! `swarm.json`: a peer's table of the run's peers as their heartbeats describe them
//! ([`SwarmView`]), rewritten atomically about once a second; read by `atoll status
//! --swarm`, `atoll doctor` and the tests.

use std::path::Path;

use crate::heartbeat::table::SwarmView;

/// Name of the swarm table inside a peer's run dir.
pub const FILE_NAME: &str = "swarm.json";

/// Writes `swarm.json` atomically (temporary file, rename).
pub fn write(path: &Path, view: &SwarmView) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec(view)?)?;
    std::fs::rename(&tmp, path)
}

/// Reads `swarm.json`.
pub fn read(path: &Path) -> std::io::Result<SwarmView> {
    let bytes = std::fs::read(path)?;
    serde_json::from_slice(&bytes).map_err(std::io::Error::other)
}
