//! The run manifest: everything every peer of a run must agree on, and the run id.
//!
//! Model, tokeniser, data, inner-optimizer and protocol settings, seed and the run's epoch.
//! Two peers whose manifests differ would train different models or merge on different
//! schedules, so every announcement carries the manifest's blake3 (the *run id*) and a
//! message of another run is refused. The peer that refuses fetches the other manifest and
//! logs what differs (see [`Manifest::diff`]).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::data::Corpus;
use crate::delta::{Codec, EncodeOptions};
use crate::proto::{RawSettings, Settings, SettingsError};
use crate::train::preset::Preset;
use crate::train::{InnerOptimizer, TrainConfig, TrainError};

/// Version of the manifest format.
pub const FORMAT: u32 = 1;
/// Name of the manifest file in a peer's run dir.
pub const FILE_NAME: &str = "manifest.json";
/// The only tokeniser: raw bytes, vocabulary 256.
pub const TOKENIZER: &str = "bytes";
/// Largest manifest accepted from a file or a peer.
pub const MAX_BYTES: usize = 64 << 10;

/// What a run trains on. The corpus is named by its identity, so peers may hold it at
/// different paths (see [`Corpus::hash`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSpec {
    /// The corpus identity (hex): blake3 of the text for the embedded corpus, of the file
    /// listing (relative paths, sizes, both ends) for files on disk.
    pub corpus_blake3: String,
}

/// A run's manifest (JSON on disk and on the wire).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: u32,
    /// Name of the swarm: peers meet under it (DHT key and gossip topic).
    pub name: String,
    pub tokenizer: String,
    /// Model, batch, inner optimizer and the run seed.
    pub train: TrainConfig,
    pub data: DataSpec,
    pub protocol: RawSettings,
    /// Unix time (ms) of the run's round 0; rounds are counted from it.
    pub epoch_unix_ms: u64,
    /// A closed run: the libp2p peer ids allowed to take part (empty: anyone). Peers refuse
    /// connections and messages from others, and a peer not on the list refuses to start.
    /// Left out of the JSON when empty, so open runs keep their run ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
}

/// Protocol settings of the default run and of `atoll demo` (DESIGN.md §3.4: `P` 4,
/// `τ` 2, `K` 1, outer lr 0.7 — a new run of Muon takes [`outer_lr`]'s instead; deltas by
/// [`default_encode`]), tuned for the default model on 2 cores: see ARCHITECTURE.md "The
/// default run".
pub fn default_protocol() -> RawSettings {
    RawSettings {
        h: 10,
        step_ms: 250,
        grace_cap_ms: 500,
        momentum: 0.3,
        merge_lag: 0,
        encode: default_encode(),
        strict_states: true,
        ..RawSettings::default()
    }
}

/// [`default_protocol`] for a run of `preset` whose inner optimizer is `optimizer`: its
/// rounds paced by the preset's reference step ([`Preset::step_ms`]; the default preset's
/// is `default_protocol`'s own), its outer step the optimizer's ([`outer_lr`]).
pub fn preset_protocol(preset: Preset, optimizer: InnerOptimizer) -> RawSettings {
    RawSettings { step_ms: preset.step_ms(), outer_lr: outer_lr(optimizer), ..default_protocol() }
}

/// The outer learning rate of a new run whose peers step with `optimizer`: DESIGN.md
/// §3.4's 0.7 after AdamW; 1.0 after Muon, whose 4-peer demo ends 2.8% lower with it at
/// 300 steps (2.860 against 2.943, three seeds) and 0.5% at 2,000, on fewer bytes
/// (bench/RESULTS.md, "Muon's outer rate").
pub fn outer_lr(optimizer: InnerOptimizer) -> f32 {
    match optimizer {
        InnerOptimizer::Adamw => RawSettings::default().outer_lr,
        InnerOptimizer::Muon => 1.0,
    }
}

/// The default run's delta codec: in each block of 4,096 values the 512 largest, each a
/// sign and one of two magnitudes, and error feedback that carries 0.8 of what a delta did
/// not send. Measured against 4-bit blockwise deltas (DESIGN.md §3.4's choice,
/// [`EncodeOptions::default`]) in the 4-peer demo: the same final val_bpb within 1% at 300
/// and at 2,000 steps, on 4–4.6× fewer bytes (bench/RESULTS.md, "A sparse default codec").
pub fn default_encode() -> EncodeOptions {
    EncodeOptions { codec: Codec::Top2, block: 4096, keep: 512, zstd_level: 3, feedback_decay: 0.8 }
}

/// A manifest that cannot run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    #[error("cannot read manifest {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("manifest is not valid: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("manifest is larger than {MAX_BYTES} bytes")]
    TooLarge,
    #[error("manifest format {0} is not supported (this atoll reads format {FORMAT})")]
    Format(u32),
    #[error("tokenizer {0:?} is not supported (only \"bytes\")")]
    Tokenizer(String),
    #[error("run name {0:?} must be 1 to 64 characters of [A-Za-z0-9._-]")]
    Name(String),
    #[error(transparent)]
    Train(#[from] TrainError),
    // Not a `#[source]`: the message already holds it, and a chain would say it twice.
    #[error("protocol settings: {0}")]
    Protocol(SettingsError),
    #[error("the corpus has blake3 {have} but the manifest wants {want}")]
    Corpus { have: String, want: String },
    #[error("allow list entry {0:?} is not a libp2p peer id")]
    Allow(String),
}

impl From<SettingsError> for ManifestError {
    fn from(e: SettingsError) -> Self {
        ManifestError::Protocol(e)
    }
}

/// The run id: blake3 of the manifest's canonical JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RunId(pub [u8; 32]);

impl RunId {
    /// Short form for logs and status files (16 hex digits).
    pub fn short(&self) -> String {
        self.0[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The whole id, 64 lower-case hex digits (what `--join` takes).
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.short())
    }
}

impl Manifest {
    /// The default run on `corpus`: default model, batch and protocol, epoch 0.
    pub fn new(name: &str, train: TrainConfig, corpus: &Corpus, protocol: RawSettings) -> Self {
        Self {
            format: FORMAT,
            name: name.to_owned(),
            tokenizer: TOKENIZER.to_owned(),
            train,
            data: DataSpec { corpus_blake3: corpus.hash().to_hex().to_string() },
            protocol,
            epoch_unix_ms: 0,
            allow: Vec::new(),
        }
    }

    /// Checks every part; returns the validated protocol settings.
    pub fn validate(&self) -> Result<Settings, ManifestError> {
        if self.format != FORMAT {
            return Err(ManifestError::Format(self.format));
        }
        if self.tokenizer != TOKENIZER {
            return Err(ManifestError::Tokenizer(self.tokenizer.clone()));
        }
        if atoll_net::config::validate_run_name(&self.name).is_err() {
            return Err(ManifestError::Name(self.name.clone()));
        }
        self.train.validate()?;
        self.allowed()?;
        let tokens_per_step = self.train.tokens_per_step() as u64;
        Ok(Settings::new(self.protocol.clone())?.with_tokens_per_step(tokens_per_step))
    }

    /// The allow list as peer ids (`None`: an open run).
    pub fn allowed(
        &self,
    ) -> Result<Option<std::collections::HashSet<atoll_net::PeerId>>, ManifestError> {
        if self.allow.is_empty() {
            return Ok(None);
        }
        let ids = self.allow.iter().map(|s| s.parse().map_err(|_| ManifestError::Allow(s.clone())));
        Ok(Some(ids.collect::<Result<_, _>>()?))
    }

    /// Refuses a corpus other than the one the manifest names.
    pub fn check_corpus(&self, corpus: &Corpus) -> Result<(), ManifestError> {
        let have = corpus.hash().to_hex().to_string();
        if have != self.data.corpus_blake3 {
            return Err(ManifestError::Corpus { have, want: self.data.corpus_blake3.clone() });
        }
        Ok(())
    }

    /// Canonical bytes: the JSON every peer hashes and serves.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a manifest always serialises")
    }

    /// Parses and validates manifest bytes (from a file or a peer).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ManifestError> {
        if bytes.len() > MAX_BYTES {
            return Err(ManifestError::TooLarge);
        }
        let m: Manifest = serde_json::from_slice(bytes)?;
        m.validate()?;
        Ok(m)
    }

    /// Reads and validates a manifest file.
    pub fn load(path: &Path) -> Result<Self, ManifestError> {
        let io = |source| ManifestError::Io { path: path.display().to_string(), source };
        let len = std::fs::metadata(path).map_err(io)?.len();
        if len > MAX_BYTES as u64 {
            return Err(ManifestError::TooLarge);
        }
        Self::from_bytes(&std::fs::read(path).map_err(io)?)
    }

    /// The run id.
    pub fn run_id(&self) -> RunId {
        RunId(*blake3::hash(&self.to_bytes()).as_bytes())
    }

    /// What differs between two manifests, one `path: ours ≠ theirs` line per field.
    pub fn diff(&self, other: &Manifest) -> Vec<String> {
        let a = serde_json::to_value(self).unwrap_or_default();
        let b = serde_json::to_value(other).unwrap_or_default();
        let mut out = Vec::new();
        diff_values("", &a, &b, &mut out);
        out
    }
}

fn diff_values(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                let null = Value::Null;
                diff_values(&p, x.get(k).unwrap_or(&null), y.get(k).unwrap_or(&null), out);
            }
        }
        _ if a != b => out.push(format!("{path}: {a} ≠ {b}")),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        let corpus = Corpus::from_text("t", b"hello world, hello swarm".repeat(50)).unwrap();
        Manifest::new("test-run", TrainConfig::tiny(3), &corpus, RawSettings::default())
    }

    #[test]
    fn run_id_is_stable_and_changes_with_any_field() {
        let m = manifest();
        let back = Manifest::from_bytes(&m.to_bytes()).unwrap();
        assert_eq!(back.run_id(), m.run_id());
        let mut other = m.clone();
        other.protocol.h = 25;
        assert_ne!(other.run_id(), m.run_id());
        assert_eq!(m.diff(&other), vec!["protocol.h: 50 ≠ 25".to_string()]);
        let mut seeded = m.clone();
        seeded.train.seed = 4;
        assert_eq!(m.diff(&seeded), vec!["train.seed: 3 ≠ 4".to_string()]);
        let mut swished = m.clone();
        swished.train.model.activation = crate::model::Activation::HardSwish;
        assert_ne!(swished.run_id(), m.run_id());
        assert_eq!(m.diff(&swished).len(), 1, "{:?}", m.diff(&swished));
        let back = Manifest::from_bytes(&swished.to_bytes()).unwrap();
        assert_eq!(back.run_id(), swished.run_id());
    }

    #[test]
    fn bad_manifests_are_refused_with_the_reason() {
        let mut m = manifest();
        m.tokenizer = "bpe".into();
        let e = Manifest::from_bytes(&m.to_bytes()).unwrap_err().to_string();
        assert!(e.contains("tokenizer"), "{e}");
        let mut m = manifest();
        m.protocol.quorum = 0;
        let e = Manifest::from_bytes(&m.to_bytes()).unwrap_err().to_string();
        assert!(e.contains("quorum"), "{e}");
        let mut m = manifest();
        m.name = "no/slash".into();
        assert!(Manifest::from_bytes(&m.to_bytes()).is_err());
        assert!(Manifest::from_bytes(b"{\"format\":1}").is_err());
        assert!(Manifest::from_bytes(&vec![b' '; MAX_BYTES + 1]).is_err());
        let other = Corpus::from_text("u", b"other text entirely here".repeat(50)).unwrap();
        assert!(manifest().check_corpus(&other).is_err());
    }
}
