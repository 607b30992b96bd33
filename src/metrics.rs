//! `metrics.jsonl`: one JSON object per validation pass, appended, so a run's learning curve
//! survives restarts and can be read by scripts and benchmarks.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// File name inside a run dir.
pub const FILE_NAME: &str = "metrics.jsonl";

/// One validation record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsRecord {
    /// Inner steps taken.
    pub step: u64,
    /// Tokens (bytes) trained on.
    pub tokens: u64,
    /// Mean training loss (nats/byte) since the previous record.
    pub train_loss: f64,
    /// Validation loss (nats/byte).
    pub val_loss: f64,
    /// Validation bits per byte (`val_loss / ln 2`; tokens are bytes).
    pub val_bpb: f64,
    /// Training throughput since the previous record.
    pub tokens_per_s: f64,
    /// Seconds since this process started training.
    pub wall_s: f64,
}

/// Bits per byte of a loss in nats per byte token.
pub fn bits_per_byte(loss_nats: f64) -> f64 {
    loss_nats / std::f64::consts::LN_2
}

/// Appends records to a run dir's `metrics.jsonl`.
#[derive(Debug)]
pub struct MetricsLog {
    path: PathBuf,
}

impl MetricsLog {
    pub fn new(run_dir: &Path) -> Self {
        Self { path: run_dir.join(FILE_NAME) }
    }

    pub fn append(&self, record: &MetricsRecord) -> std::io::Result<()> {
        append_jsonl(&self.path, record)
    }

    /// Every record in the file (lines that do not parse are skipped: a crash can cut the
    /// last line short).
    pub fn read(run_dir: &Path) -> std::io::Result<Vec<MetricsRecord>> {
        read_jsonl(&run_dir.join(FILE_NAME))
    }
}

/// Appends one JSON object as a line (one `write` call, so a reader never sees half of a
/// line that was written whole). A write cut short (full disk) is truncated away, so the
/// next record does not run into it.
pub fn append_jsonl<T: Serialize>(path: &Path, record: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    let len = file.metadata()?.len();
    file.write_all(&line).inspect_err(|_| {
        let _ = file.set_len(len);
    })
}

/// Every line of a JSON-lines file that parses as `T`; the others (a line a crash cut
/// short) are skipped.
pub fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> std::io::Result<Vec<T>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}
