//! `merges.jsonl`: one line per merge a peer made, naming who contributed how many tokens.
//! The chaos harness reads it to measure goodput (tokens that reached a merged anchor) and
//! uptime (periods in which a merge happened), and whether a restarted peer contributed.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::metrics::{append_jsonl, read_jsonl};
use crate::proto::{MergeReport, PeerId};

/// Name of the file inside a peer's run dir.
pub const FILE_NAME: &str = "merges.jsonl";

/// One merge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MergeRecord {
    /// Wall-clock time of the merge (milliseconds since the Unix epoch).
    pub unix_ms: u64,
    pub fragment: usize,
    pub round: u64,
    pub contributions: Vec<ContributionRecord>,
}

/// One contribution of a merge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContributionRecord {
    /// Protocol id of the peer that made it ([`peer_hex`]).
    pub peer: String,
    /// Content hash of the delta: the same contribution has the same hash on every peer.
    pub hash: String,
    pub tokens: u64,
    /// Its weight factor for agreeing with the round, in `[0, 1]` (0: it went against the
    /// round and weighed nothing). Absent in logs from before it was recorded: 1.
    #[serde(default = "one")]
    pub agreement: f64,
}

fn one() -> f64 {
    1.0
}

/// The protocol id as `status.json` and `merges.jsonl` write it.
pub fn peer_hex(id: PeerId) -> String {
    format!("{:016x}", id.0)
}

/// Appends merges to a run dir's `merges.jsonl`; a failed write is logged once and
/// training goes on (the file is a report, not state).
#[derive(Debug)]
pub struct Ledger {
    path: PathBuf,
    warned: bool,
}

impl Ledger {
    pub fn new(run_dir: &Path) -> Self {
        Self { path: run_dir.join(FILE_NAME), warned: false }
    }

    pub fn record(&mut self, unix_ms: u64, r: &MergeReport) {
        let contributions = r
            .merged
            .iter()
            .zip(&r.contributions)
            .map(|(hash, c)| ContributionRecord {
                peer: peer_hex(c.origin),
                hash: hash.to_string(),
                tokens: c.tokens,
                agreement: c.agreement,
            })
            .collect();
        let record = MergeRecord { unix_ms, fragment: r.fragment, round: r.round, contributions };
        if let Err(e) = append_jsonl(&self.path, &record) {
            if !std::mem::replace(&mut self.warned, true) {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot append to the merge log");
            }
        }
    }
}

/// Every merge recorded in a run dir (empty if there is none).
pub fn read(run_dir: &Path) -> std::io::Result<Vec<MergeRecord>> {
    match read_jsonl(&run_dir.join(FILE_NAME)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        other => other,
    }
}
