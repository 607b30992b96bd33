//! Where the bytes come from: the embedded default corpus (in memory), or text and JSONL
//! files on disk, read a window at a time so a corpus may be larger than memory.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The default corpus (complete works of Shakespeare, public domain; see `data/README.md`).
const EMBEDDED_ZST: &[u8] = include_bytes!("../../data/shakespeare.txt.zst");
/// Decompressed size limit of the embedded corpus (it is about 5 MB).
const EMBEDDED_LIMIT: usize = 16 << 20;
/// Bytes read from each end of a file for the corpus identity and the format checks: a
/// directory of a million files costs 8 GB of reads at start, not 128.
pub const SNIFF_BYTES: usize = 4 << 10;
/// Name of the identity scheme of on-disk corpora, hashed first (bump to change the scheme).
const FILES_ID: &[u8] = b"atoll corpus files v1";

/// Errors in loading or reading training data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    #[error("data path {path} does not exist")]
    Missing { path: PathBuf },
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not UTF-8 text (first invalid byte at offset {offset}); atoll trains on text files and JSONL")]
    NotText { path: PathBuf, offset: u64 },
    #[error("{path}, line at byte {offset}: {reason}; a JSONL corpus holds one object with a \"text\" string per line")]
    Jsonl { path: PathBuf, offset: u64, reason: String },
    #[error("{path} holds no text (empty file or directory without files)")]
    Empty { path: PathBuf },
    #[error("{path} changed while training: expected {expected} bytes, found fewer")]
    Changed { path: PathBuf, expected: u64 },
    #[error("the embedded corpus is damaged: {0}")]
    Embedded(String),
    #[error("{bytes} bytes of text is too little for context {context}: need at least {needed}")]
    TooSmall { bytes: u64, needed: u64, context: usize },
    #[error("shard {shard} of {count} holds no training block: use fewer shards or more data")]
    EmptyShard { shard: u32, count: u32 },
}

/// How a part's bytes become text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The bytes are the text.
    Text,
    /// One JSON object per line; its `"text"` string is the text (files named `*.jsonl`).
    Jsonl,
}

/// Where a part's bytes live.
#[derive(Debug, Clone)]
enum Source {
    Memory(Arc<[u8]>),
    /// Opened for each read, so a directory of many files holds no descriptors.
    File(PathBuf),
}

/// One file of a corpus (or the in-memory text).
#[derive(Debug, Clone)]
pub struct Part {
    source: Source,
    format: Format,
    len: u64,
}

impl Part {
    pub fn format(&self) -> Format {
        self.format
    }

    /// Size in bytes (of the raw file, for JSONL).
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file's path, or `(memory)` for text held in memory.
    pub fn path(&self) -> &Path {
        match &self.source {
            Source::File(p) => p,
            Source::Memory(_) => Path::new("(memory)"),
        }
    }

    /// Fills `buf` with the bytes at `offset`; a file that shrank since loading is an error.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DataError> {
        let end = offset + buf.len() as u64;
        let changed = || DataError::Changed { path: self.path().to_owned(), expected: end };
        match &self.source {
            Source::Memory(bytes) => {
                let range = usize::try_from(offset).ok().zip(usize::try_from(end).ok());
                let (start, end) = range.ok_or_else(changed)?;
                buf.copy_from_slice(bytes.get(start..end).ok_or_else(changed)?);
            }
            Source::File(path) => {
                use std::os::unix::fs::FileExt;
                let io = |e| DataError::Io { path: path.clone(), source: e };
                let file = std::fs::File::open(path).map_err(io)?;
                file.read_exact_at(buf, offset).map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => changed(),
                    _ => io(e),
                })?;
            }
        }
        Ok(())
    }

    /// The whole part through a reader (for a streaming scan).
    pub fn reader(&self) -> Result<Box<dyn Read + '_>, DataError> {
        Ok(match &self.source {
            Source::Memory(bytes) => Box::new(&bytes[..]),
            Source::File(path) => Box::new(
                std::fs::File::open(path)
                    .map_err(|e| DataError::Io { path: path.clone(), source: e })?,
            ),
        })
    }
}

/// A body of training text: one or more parts, and an identity that peers of one run share.
#[derive(Debug, Clone)]
pub struct Corpus {
    name: String,
    parts: Arc<[Part]>,
    hash: blake3::Hash,
}

impl Corpus {
    /// The embedded default corpus.
    pub fn embedded() -> Result<Self, DataError> {
        // In one call into a buffer of the limit's capacity: a stream read zeroed and
        // regrew its buffer, a tenth of a peer's start-up.
        let bytes = zstd::bulk::decompress(EMBEDDED_ZST, EMBEDDED_LIMIT)
            .map_err(|e| DataError::Embedded(e.to_string()))?;
        Self::from_text("shakespeare (embedded)", bytes)
    }

    /// A text or JSONL file, or every such file under a directory (recursively, in path
    /// order; names starting with `.` are skipped). Nothing is read beyond the first and
    /// last [`SNIFF_BYTES`] of each file: windows are read from disk while training.
    ///
    /// The identity is blake3 over each file's path relative to `path`, its size and the
    /// bytes at both ends, so peers holding the same files anywhere agree without hashing
    /// all of them; an edit that keeps a file's size and both ends goes unnoticed.
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
        let mut id = blake3::Hasher::new();
        id.update(FILES_ID);
        let mut parts = Vec::new();
        for file in files {
            let io = |e| DataError::Io { path: file.clone(), source: e };
            let len = std::fs::metadata(&file).map_err(io)?.len();
            if len == 0 {
                continue;
            }
            let format = if file.extension().is_some_and(|e| e == "jsonl") {
                Format::Jsonl
            } else {
                Format::Text
            };
            let part = Part { source: Source::File(file.clone()), format, len };
            let (head, tail) = sniff(&part)?;
            check_format(&part, &head)?;
            let relative = file.strip_prefix(path).unwrap_or(&file);
            let relative = relative.to_string_lossy();
            id.update(&(relative.len() as u64).to_le_bytes());
            id.update(relative.as_bytes());
            id.update(&[format as u8]);
            id.update(&len.to_le_bytes());
            id.update(blake3::hash(&head).as_bytes());
            id.update(blake3::hash(&tail).as_bytes());
            parts.push(part);
        }
        if parts.is_empty() {
            return Err(DataError::Empty { path: path.to_owned() });
        }
        Ok(Self { name: path.display().to_string(), parts: parts.into(), hash: id.finalize() })
    }

    /// A corpus from text already in memory (non-empty UTF-8), named by the hash of its bytes.
    pub fn from_text(name: &str, bytes: Vec<u8>) -> Result<Self, DataError> {
        if bytes.is_empty() {
            return Err(DataError::Empty { path: name.into() });
        }
        if let Err(e) = std::str::from_utf8(&bytes) {
            return Err(DataError::NotText { path: name.into(), offset: e.valid_up_to() as u64 });
        }
        let hash = blake3::hash(&bytes);
        let len = bytes.len() as u64;
        let part = Part { source: Source::Memory(bytes.into()), format: Format::Text, len };
        Ok(Self { name: name.to_owned(), parts: Arc::new([part]), hash })
    }

    /// Where the text came from, for people.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The files (or the one in-memory text), in order.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// Total bytes over all parts (raw bytes for JSONL).
    pub fn len(&self) -> u64 {
        self.parts.iter().map(Part::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The corpus identity: peers of one run must train on the same data.
    pub fn hash(&self) -> blake3::Hash {
        self.hash
    }
}

/// The first and last [`SNIFF_BYTES`] of a part (overlapping for small files).
fn sniff(part: &Part) -> Result<(Vec<u8>, Vec<u8>), DataError> {
    let n = part.len.min(SNIFF_BYTES as u64);
    let mut head = vec![0; n as usize];
    part.read_at(0, &mut head)?;
    if part.len == n {
        return Ok((head.clone(), head));
    }
    let mut tail = vec![0; n as usize];
    part.read_at(part.len - n, &mut tail)?;
    Ok((head, tail))
}

/// Refuses a file whose start is not text, or not JSONL with a `"text"` string.
fn check_format(part: &Part, head: &[u8]) -> Result<(), DataError> {
    let valid = match std::str::from_utf8(head) {
        Ok(_) => head.len(),
        // A character cut by the end of the sniffed bytes is not an error.
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(e) => {
            let offset = e.valid_up_to() as u64;
            return Err(DataError::NotText { path: part.path().to_owned(), offset });
        }
    };
    if part.format == Format::Jsonl {
        let text = &head[..valid];
        // Whole lines only, unless the sniffed bytes are the whole file.
        let whole = if head.len() as u64 == part.len {
            text.len()
        } else {
            text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)
        };
        let mut offset = 0;
        for line in text[..whole].split_inclusive(|&b| b == b'\n') {
            jsonl_text(line, part.path(), offset)?;
            offset += line.len() as u64;
        }
    }
    Ok(())
}

/// One JSONL line's text (`None` for a blank line).
pub(crate) fn jsonl_text(
    line: &[u8],
    path: &Path,
    offset: u64,
) -> Result<Option<String>, DataError> {
    #[derive(serde::Deserialize)]
    struct Doc {
        text: String,
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice::<Doc>(line).map(|d| Some(d.text)).map_err(|e| {
        // serde's own "at line 1 column N" counts within the line: say so.
        let reason = e.to_string();
        let reason = match reason.rsplit_once(" at line ") {
            Some((what, _)) => format!("{what} (column {} of the line)", e.column()),
            None => reason,
        };
        DataError::Jsonl { path: path.to_owned(), offset, reason }
    })
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), DataError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| DataError::Io { path: dir.to_owned(), source: e })?;
    for entry in entries {
        let entry = entry.map_err(|e| DataError::Io { path: dir.to_owned(), source: e })?;
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
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
        assert_eq!(c.len(), 5_057_282);
        let mut text = vec![0; c.len() as usize];
        c.parts()[0].read_at(0, &mut text).unwrap();
        assert!(std::str::from_utf8(&text).unwrap().contains("To be, or not to be"));
    }

    #[test]
    fn missing_empty_binary_and_bad_jsonl_paths_are_clear_errors() {
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
        let jsonl = dir.path().join("docs.jsonl");
        std::fs::write(&jsonl, "{\"text\": \"fine\"}\n{\"body\": \"no text field\"}\n").unwrap();
        let err = Corpus::load(&jsonl).unwrap_err();
        assert!(matches!(err, DataError::Jsonl { offset: 17, .. }), "{err}");
        assert!(err.to_string().contains("missing field `text`"), "{err}");
    }

    #[test]
    fn directories_are_read_in_path_order_and_hidden_files_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("b")).unwrap();
        std::fs::write(dir.path().join("b/2.jsonl"), "{\"text\":\"two\"}\n").unwrap();
        std::fs::write(dir.path().join("a.txt"), "one ").unwrap();
        std::fs::write(dir.path().join(".hidden"), [0xff, 0xfe]).unwrap();
        let c = Corpus::load(dir.path()).unwrap();
        let formats: Vec<_> = c.parts().iter().map(|p| (p.len(), p.format())).collect();
        assert_eq!(formats, [(4, Format::Text), (15, Format::Jsonl)]);
    }

    #[test]
    fn the_identity_follows_names_sizes_and_ends_not_the_location() {
        let write = |root: &Path, files: &[(&str, &[u8])]| {
            for (name, bytes) in files {
                std::fs::write(root.join(name), bytes).unwrap();
            }
            Corpus::load(root).unwrap().hash()
        };
        let big = vec![b'x'; 3 * SNIFF_BYTES];
        let base: [(&str, &[u8]); 2] = [("a.txt", b"some text"), ("b.txt", &big)];
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        assert_eq!(write(d1.path(), &base), write(d2.path(), &base));
        let renamed = tempfile::tempdir().unwrap();
        assert_ne!(write(renamed.path(), &[base[0], ("c.txt", &big)]), write(d1.path(), &base));
        let mut edited = big.clone();
        *edited.last_mut().unwrap() = b'y';
        let e = tempfile::tempdir().unwrap();
        assert_ne!(write(e.path(), &[base[0], ("b.txt", &edited)]), write(d1.path(), &base));
    }
}
