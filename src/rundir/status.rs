//! `status.json`: what a peer tells people and scripts about itself, rewritten atomically.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use atoll_net::NetStats;
use serde::{Deserialize, Serialize};

/// Name of the status file inside a peer's run dir.
pub const FILE_NAME: &str = "status.json";

/// Training and protocol progress of a training peer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingStatus {
    /// The run id (blake3 of the run manifest, short hex): peers of another run are refused.
    /// Earlier versions wrote it as `manifest_id`; their files still read.
    #[serde(alias = "manifest_id")]
    pub run_id: String,
    /// Inner steps taken.
    pub step: u64,
    /// Step target (`None` when the peer trains until stopped).
    pub target_step: Option<u64>,
    /// Tokens trained on.
    pub tokens: u64,
    /// Tokens of the checkpoint this process resumed from (0 for a fresh peer): this
    /// process computed `tokens − tokens_at_start`.
    #[serde(default)]
    pub tokens_at_start: u64,
    /// The peer's id in the protocol and in `merges.jsonl` (from its libp2p id).
    #[serde(default)]
    pub proto_id: String,
    /// Training loss of the latest step.
    pub loss: Option<f32>,
    pub tokens_per_s: f64,
    /// The backend the peer trains on (`flex`, `ndarray`, `wgpu`).
    #[serde(default)]
    pub backend: String,
    /// Validation bits per byte of the latest validation pass (local parameters).
    pub val_bpb: Option<f64>,
    /// Round of each fragment's state.
    pub round: Vec<u64>,
    /// blake3 (hex) of each fragment's state: equal on all peers that agree.
    pub anchor_hashes: Vec<String>,
    /// Merges, skipped rounds and adopted states so far.
    pub merges: u64,
    pub skipped: u64,
    pub adopted: u64,
    /// Of `adopted`, states recomputed here from their recipe (no state fetched).
    #[serde(default)]
    pub recomputed: u64,
    /// States nothing here could recompute and no majority held (a split swarm's ruling
    /// lineage, a plurality), weighed on this peer's validation data before adoption; the
    /// ones found worse than its own are `refusals.worse_state`.
    #[serde(default)]
    pub weighed: u64,
    /// Messages refused because they belong to another run manifest.
    pub foreign_messages: u64,
    /// When the latest of them came (`atoll doctor` reports a mismatch while they keep
    /// coming, not for ever after a foreign peer left).
    #[serde(default)]
    pub last_foreign_unix_ms: Option<u64>,
    /// Protocol offences by kind (`forged_author`, `inflated_claim`, `equivocation`, ...):
    /// each is provable from what the peer sent. Network-level rejections are in
    /// `stats.rejects`.
    #[serde(default)]
    pub rejected: std::collections::BTreeMap<String, u64>,
    /// Contributions dropped because they made a merge non-finite.
    #[serde(default)]
    pub nonfinite_dropped: u64,
    /// What the peer did not take, by cause (`fetch_failed`, `silent`, `budget_full`,
    /// `forged_state`, `unbacked_state`, `nonfinite`, ...): not provable offences, but where a
    /// stalling, flooding or forging peer shows (`proto::Metrics::refusals`).
    #[serde(default)]
    pub refusals: std::collections::BTreeMap<String, u64>,
    /// The peers most refusals were owed to (at most 8, by libp2p id, or by the
    /// protocol's short id for a peer never connected), with their counts: who is
    /// stalling, forging or pulling against the swarm (`proto::Metrics::refused_from`).
    #[serde(default)]
    pub refused_from: std::collections::BTreeMap<String, u64>,
    /// Payload bytes by kind (`delta_published`: this peer's own deltas, once each;
    /// `delta_fetched`, `state_fetched`: what it downloaded and verified). The network's
    /// per-protocol totals, retransfers and serving included, are in `stats`.
    #[serde(default)]
    pub payload_bytes: std::collections::BTreeMap<String, u64>,
    /// Whole states fetched, by why the state could not be recomputed from its recipe
    /// (`no_recipe`, `no_parent`: another lineage, `missing_deltas`, `recipe_failed`;
    /// `retry`: fetched again after a failed fetch).
    #[serde(default)]
    pub state_fetch_causes: std::collections::BTreeMap<String, u64>,
    /// Deltas this peer published.
    #[serde(default)]
    pub published: u64,
    /// Sampled contributions (`protocol.contributors`): each fragment's contribution
    /// period (1: this peer publishes every round), and the snapshots whose work was
    /// banked for the next slot or, more than `MAX_BANKED_ROUNDS` before it, not sent.
    #[serde(default)]
    pub period: Vec<u32>,
    #[serde(default)]
    pub banked: u64,
    #[serde(default)]
    pub unsent: u64,
    /// Milliseconds from the start of this process's node to the end of its first inner
    /// step (a late joiner first takes the swarm's anchors), and the fragment rounds it
    /// started from.
    #[serde(default)]
    pub join_ms: Option<u64>,
    /// Milliseconds from the start of the node to the release of a held late joiner's
    /// trainer: the moment it starts its first step on the swarm's anchors.
    #[serde(default)]
    pub release_ms: Option<u64>,
    #[serde(default)]
    pub join_rounds: Vec<u64>,
    /// Parameters of the model.
    pub param_count: usize,
    /// The step target was reached; the peer keeps merging until the swarm is quiet.
    pub trained: bool,
    /// Evaluation of the final anchors, once the peer finished.
    pub final_val_loss: Option<f64>,
    pub final_val_bpb: Option<f64>,
    // What `atoll doctor` compares with (from the manifest)
    /// One fragment cycle, `h × step_ms`.
    #[serde(default)]
    pub period_ms: u64,
    /// The grace window's cap (`grace_cap_ms`): clocks must agree well within it.
    #[serde(default)]
    pub grace_ms: u64,
    /// Bytes of this peer's deltas in one period (every fragment once, at their largest
    /// encoding): what each fetcher downloads from it per period.
    #[serde(default)]
    pub delta_bytes_per_period: u64,
}

/// What `status.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusFile {
    /// False once the peer has stopped.
    pub running: bool,
    /// Process id of the peer.
    pub pid: u32,
    /// When the file was written (milliseconds since the Unix epoch).
    pub updated_unix_ms: u64,
    #[serde(flatten)]
    pub stats: NetStats,
    /// Present on training peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<TrainingStatus>,
    /// Where this peer serves its status page and metrics (`--http`, `--metrics-addr`).
    #[serde(flatten)]
    pub endpoints: Endpoints,
}

/// Addresses of the status page and metrics servers, once bound (`None`: not served).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoints {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_addr: Option<String>,
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Writes the status file atomically: a reader sees the old or the new file, never half.
pub fn write(
    path: &Path,
    running: bool,
    stats: NetStats,
    training: Option<TrainingStatus>,
) -> std::io::Result<()> {
    write_with(path, running, stats, training, Endpoints::default())
}

/// [`write`](fn@write), naming where the status page and metrics are served.
pub fn write_with(
    path: &Path,
    running: bool,
    stats: NetStats,
    training: Option<TrainingStatus>,
    endpoints: Endpoints,
) -> std::io::Result<()> {
    let status = StatusFile {
        running,
        pid: std::process::id(),
        updated_unix_ms: unix_ms(),
        stats,
        training,
        endpoints,
    };
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&status)?)?;
    std::fs::rename(&tmp, path)
}

/// Reads a status file.
pub fn read(path: &Path) -> std::io::Result<StatusFile> {
    let bytes = std::fs::read(path)?;
    serde_json::from_slice(&bytes).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_that_names_the_run_id_manifest_id_still_reads() {
        let t = TrainingStatus { run_id: "0011223344556677".into(), step: 9, ..Default::default() };
        let mut json = serde_json::to_value(&t).unwrap();
        assert!(json.get("run_id").is_some() && json.get("manifest_id").is_none(), "{json}");
        let fields = json.as_object_mut().unwrap();
        let id = fields.remove("run_id").unwrap();
        fields.insert("manifest_id".into(), id);
        let old: TrainingStatus = serde_json::from_value(json).unwrap();
        assert_eq!(old, t);
    }
}
