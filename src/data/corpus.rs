//! Where the bytes come from: the embedded default corpus, or a UTF-8 file or directory.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The default corpus (complete works of Shakespeare, public domain; see `data/README.md`).
const EMBEDDED_ZST: &[u8] = include_bytes!("../../data/shakespeare.txt.zst");
/// Decompressed size limit of the embedded corpus (it is about 5 MB).
const EMBEDDED_LIMIT: u64 = 16 << 20;
/// Largest corpus read from disk; beyond this a peer would hold too much in memory.
pub const MAX_CORPUS_BYTES: u64 = 2 << 30;

/// Errors in loading training data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    #[error("data path {path} does not exist")]
    Missing { path: PathBuf },
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not UTF-8 text (first invalid byte at offset {offset}); atoll trains on text files")]
    NotText { path: PathBuf, offset: usize },
    #[error("{path} holds no text (empty file or directory without files)")]
    Empty { path: PathBuf },
    #[error("data is larger than the {limit}-byte limit")]
    TooLarge { limit: u64 },
    #[error("the embedded corpus is damaged: {0}")]
    Embedded(String),
    #[error("{bytes} bytes of text is too little for context {context}: need at least {needed}")]
    TooSmall { bytes: usize, needed: usize, context: usize },
    #[error("shard {shard} of {count} holds no training block: use fewer shards or more data")]
    EmptyShard { shard: u32, count: u32 },
}

/// A body of training text.
#[derive(Debug, Clone)]
pub struct Corpus {
    name: String,
    bytes: Arc<[u8]>,
    hash: blake3::Hash,
}

impl Corpus {
    /// The embedded default corpus.
    pub fn embedded() -> Result<Self, DataError> {
        let decoder = zstd::stream::read::Decoder::new(EMBEDDED_ZST)
            .map_err(|e| DataError::Embedded(e.to_string()))?;
        let mut bytes = Vec::new();
        decoder
            .take(EMBEDDED_LIMIT)
            .read_to_end(&mut bytes)
            .map_err(|e| DataError::Embedded(e.to_string()))?;
        Self::from_text("shakespeare (embedded)", bytes)
    }

    /// A UTF-8 text file, or every file under a directory (recursively, in path order).
    pub fn load(path: &Path) -> Result<Self, DataError> {
        let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => DataError::Missing { path: path.to_owned() },
            _ => DataError::Io { path: path.to_owned(), source: e },
        })?;
        let mut files = Vec::new();
        if meta.is_dir() {
            collect_files(path, &mut files)?;
            files.sort();
        } else {
            files.push(path.to_owned());
        }
        let mut bytes = Vec::new();
        for file in &files {
            let data =
                std::fs::read(file).map_err(|e| DataError::Io { path: file.clone(), source: e })?;
            if let Err(e) = std::str::from_utf8(&data) {
                return Err(DataError::NotText { path: file.clone(), offset: e.valid_up_to() });
            }
            bytes.extend_from_slice(&data);
            if bytes.len() as u64 > MAX_CORPUS_BYTES {
                return Err(DataError::TooLarge { limit: MAX_CORPUS_BYTES });
            }
        }
        if bytes.is_empty() {
            return Err(DataError::Empty { path: path.to_owned() });
        }
        Self::from_text(&path.display().to_string(), bytes)
    }

    /// A corpus from bytes already in memory (must be non-empty UTF-8).
    pub fn from_text(name: &str, bytes: Vec<u8>) -> Result<Self, DataError> {
        if bytes.is_empty() {
            return Err(DataError::Empty { path: name.into() });
        }
        if let Err(e) = std::str::from_utf8(&bytes) {
            return Err(DataError::NotText { path: name.into(), offset: e.valid_up_to() });
        }
        let hash = blake3::hash(&bytes);
        Ok(Self { name: name.to_owned(), bytes: bytes.into(), hash })
    }

    /// Where the text came from, for people.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The text.
    pub fn bytes(&self) -> Arc<[u8]> {
        self.bytes.clone()
    }

    /// blake3 of the text: peers of one run must train on the same data.
    pub fn hash(&self) -> blake3::Hash {
        self.hash
    }
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), DataError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| DataError::Io { path: dir.to_owned(), source: e })?;
    for entry in entries {
        let entry = entry.map_err(|e| DataError::Io { path: dir.to_owned(), source: e })?;
        let path = entry.path();
        let kind =
            entry.file_type().map_err(|e| DataError::Io { path: path.clone(), source: e })?;
        if kind.is_dir() {
            collect_files(&path, out)?;
        } else if kind.is_file() {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_corpus_is_the_documented_text() {
        let c = Corpus::embedded().unwrap();
        assert_eq!(c.bytes().len(), 5_057_282);
        assert!(std::str::from_utf8(&c.bytes()).unwrap().contains("To be, or not to be"));
    }

    #[test]
    fn missing_empty_and_binary_paths_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.txt");
        assert!(matches!(Corpus::load(&missing), Err(DataError::Missing { .. })));
        let empty = dir.path().join("empty.txt");
        std::fs::write(&empty, b"").unwrap();
        assert!(matches!(Corpus::load(&empty), Err(DataError::Empty { .. })));
        let binary = dir.path().join("blob.bin");
        std::fs::write(&binary, [0x66, 0x6f, 0xff, 0xfe, 0x00]).unwrap();
        let err = Corpus::load(&binary).unwrap_err();
        assert!(matches!(err, DataError::NotText { offset: 2, .. }), "{err}");
        let sub = dir.path().join("empty_dir");
        std::fs::create_dir(&sub).unwrap();
        assert!(matches!(Corpus::load(&sub), Err(DataError::Empty { .. })));
    }

    #[test]
    fn directories_are_read_in_path_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("b")).unwrap();
        std::fs::write(dir.path().join("b/2.txt"), "two ").unwrap();
        std::fs::write(dir.path().join("a.txt"), "one ").unwrap();
        let c = Corpus::load(dir.path()).unwrap();
        assert_eq!(&*c.bytes(), b"one two ");
    }
}
