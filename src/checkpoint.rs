//! Checkpoints: model, optimizer state, counters and data position in one file, written
//! atomically and checked with blake3 on load.
//!
//! Layout (little-endian):
//! `MAGIC | version u32 | meta_len u64 | model_len u64 | optim_len u64 | meta (JSON) |
//! model (burnpack) | optim (burnpack) | blake3 of everything before (32 bytes)`.
//! Writes go to a temporary file in the same directory, are fsynced, then renamed over the
//! old checkpoint, and the directory is fsynced: a crash at any instant leaves either the
//! old or the new checkpoint, never a mix. A killed write's temporary file is never read
//! and is overwritten by the next write; a failed one (full disk) is removed at once.
//! tests/disk.rs SIGKILLs `atoll train` mid-write and fills a disk under `atoll run`.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::data::{Corpus, Shard};
use crate::train::{RestoreError, TrainConfig, TrainState, Trainer};

const MAGIC: &[u8; 8] = b"ATOLLCKP";
/// Bumped whenever the layout or the meta schema changes incompatibly.
pub const FORMAT_VERSION: u32 = 1;
const HEADER_LEN: usize = 8 + 4 + 8 * 3;
const HASH_LEN: usize = 32;
/// File name of the latest checkpoint inside a run dir.
pub const FILE_NAME: &str = "checkpoint.atoll";
/// Refuse to read files beyond this (a damaged length field must not allocate wildly).
const MAX_FILE: u64 = 16 << 30;

/// Errors in reading or writing a checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    #[error("no checkpoint at {0}")]
    Missing(PathBuf),
    #[error("checkpoint {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("checkpoint {path} is corrupt: {reason}; it was not loaded (delete it to start over)")]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "checkpoint {path} has format version {found}, this atoll reads version {FORMAT_VERSION}"
    )]
    Version { path: PathBuf, found: u32 },
    #[error("checkpoint {path} was trained on other data (corpus hash {found}, this run uses {expected})")]
    OtherData { path: PathBuf, found: String, expected: String },
    #[error("cannot serialise the training state: {0}")]
    Encode(String),
    #[error("checkpoint {path} does not fit: {source}")]
    Restore { path: PathBuf, source: RestoreError },
}

/// Everything in a checkpoint except the tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    pub config: TrainConfig,
    /// The backend it was saved from; tensors are stored backend-neutral, so a checkpoint
    /// resumes on any backend. A name this build lacks reads as the default backend.
    #[serde(deserialize_with = "any_backend")]
    pub backend: Backend,
    pub shard: Shard,
    pub state: TrainState,
    /// blake3 (hex) of the training text, so a resume on other data is refused.
    pub corpus_hash: String,
}

/// A checkpoint read from disk and verified.
#[derive(Debug)]
pub struct Checkpoint {
    pub meta: CheckpointMeta,
    model: Vec<u8>,
    optim: Vec<u8>,
    path: PathBuf,
}

/// Path of the latest checkpoint in `run_dir`.
pub fn path_in(run_dir: &Path) -> PathBuf {
    run_dir.join(FILE_NAME)
}

/// Writes `trainer`'s state to `run_dir` atomically; returns the file's path.
pub fn save(
    trainer: &Trainer,
    shard: Shard,
    corpus: &Corpus,
    run_dir: &Path,
) -> Result<PathBuf, CheckpointError> {
    let meta = CheckpointMeta {
        config: trainer.config().clone(),
        backend: trainer.backend(),
        shard,
        state: trainer.state(),
        corpus_hash: corpus.hash().to_hex().to_string(),
    };
    let (model, optim) = trainer.snapshot().map_err(|e| CheckpointError::Encode(e.to_string()))?;
    let meta_json =
        serde_json::to_vec(&meta).map_err(|e| CheckpointError::Encode(e.to_string()))?;
    let mut bytes =
        Vec::with_capacity(HEADER_LEN + meta_json.len() + model.len() + optim.len() + HASH_LEN);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    for len in [meta_json.len(), model.len(), optim.len()] {
        bytes.extend_from_slice(&(len as u64).to_le_bytes());
    }
    bytes.extend_from_slice(&meta_json);
    bytes.extend_from_slice(&model);
    bytes.extend_from_slice(&optim);
    let hash = blake3::hash(&bytes);
    bytes.extend_from_slice(hash.as_bytes());
    let path = path_in(run_dir);
    write_atomic(&path, &bytes)
        .map_err(|source| CheckpointError::Io { path: path.clone(), source })?;
    Ok(path)
}

/// The temporary file [`write_atomic`] writes before renaming it to `path`: a hidden
/// `.NAME.tmp` next to it, so it is on the same file system (the rename is atomic) and never
/// has the real file's name (a loader that opens `path` can never see it).
///
/// The name is fixed rather than unique per writer: the leftover of a write that was killed
/// is truncated and reused by the next write instead of piling up, one checkpoint-sized
/// file per crash, on a disk that may be nearly full. The cost: two writers of the same
/// `path` at once would share it; each path has one writer (the training thread writes the
/// checkpoint, the node loop the anchors).
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

/// Writes `bytes` to `path` so that a crash at any instant leaves either the old file or
/// the new one: temporary file ([`temp_path`]), fsync, rename over `path`, fsync of the
/// directory (which makes the rename itself durable).
///
/// On an error (a full disk) the temporary file is removed, so a failed write holds no
/// space, and `path` is untouched.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = temp_path(path);
    let written = write_synced(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        // Best effort: the write already failed, and a leftover is overwritten next time.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::File::open(dir)?.sync_all()
}

/// Creates (or truncates a leftover) `path`, writes `bytes` and fsyncs them.
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Reads and verifies the checkpoint at `path`. Never returns unverified data.
pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let io = |source: std::io::Error| match source.kind() {
        std::io::ErrorKind::NotFound => CheckpointError::Missing(path.to_owned()),
        _ => CheckpointError::Io { path: path.to_owned(), source },
    };
    let size = std::fs::metadata(path).map_err(io)?.len();
    let corrupt = |reason: String| CheckpointError::Corrupt { path: path.to_owned(), reason };
    if size > MAX_FILE {
        return Err(corrupt(format!("{size} bytes is beyond the {MAX_FILE}-byte limit")));
    }
    let bytes = std::fs::read(path).map_err(io)?;
    if bytes.len() < HEADER_LEN + HASH_LEN || &bytes[..8] != MAGIC {
        return Err(corrupt("not an atoll checkpoint (bad magic or truncated header)".into()));
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap_or_default());
    if version != FORMAT_VERSION {
        return Err(CheckpointError::Version { path: path.to_owned(), found: version });
    }
    let len_at =
        |i: usize| u64::from_le_bytes(bytes[12 + 8 * i..20 + 8 * i].try_into().unwrap_or_default());
    let lens = [len_at(0), len_at(1), len_at(2)];
    let body: u64 = lens.iter().try_fold(0u64, |acc, &l| acc.checked_add(l)).unwrap_or(u64::MAX);
    if body.checked_add((HEADER_LEN + HASH_LEN) as u64) != Some(bytes.len() as u64) {
        return Err(corrupt(format!(
            "length fields say {body} body bytes but the file has {}",
            bytes.len()
        )));
    }
    let (content, stored) = bytes.split_at(bytes.len() - HASH_LEN);
    if blake3::hash(content).as_bytes() != stored {
        return Err(corrupt("blake3 checksum mismatch (truncated or damaged file)".into()));
    }
    let [meta_len, model_len, _] = lens.map(|l| l as usize);
    let meta_end = HEADER_LEN + meta_len;
    let model_end = meta_end + model_len;
    let meta: CheckpointMeta = serde_json::from_slice(&content[HEADER_LEN..meta_end])
        .map_err(|e| corrupt(format!("bad metadata: {e}")))?;
    Ok(Checkpoint {
        meta,
        model: content[meta_end..model_end].to_vec(),
        optim: content[model_end..].to_vec(),
        path: path.to_owned(),
    })
}

fn any_backend<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Backend, D::Error> {
    let name = String::deserialize(d)?;
    Ok(name.parse().unwrap_or_default())
}

impl Checkpoint {
    /// The same checkpoint, to be resumed on `backend` (a run dir moved to a GPU machine,
    /// or back).
    pub fn on(mut self, backend: Backend) -> Checkpoint {
        self.meta.backend = backend;
        self
    }

    /// Rebuilds the trainer, refusing a checkpoint made on other data.
    pub fn into_trainer(self, corpus: &Corpus) -> Result<Trainer, CheckpointError> {
        let expected = corpus.hash().to_hex().to_string();
        if self.meta.corpus_hash != expected {
            return Err(CheckpointError::OtherData {
                path: self.path,
                found: self.meta.corpus_hash,
                expected,
            });
        }
        let m = self.meta;
        Trainer::restore(m.config, m.backend, corpus, m.shard, m.state, self.model, self.optim)
            .map_err(|source| CheckpointError::Restore { path: self.path, source })
    }
}
