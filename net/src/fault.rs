//! Fault injection for tests: a file of peer ids that a node refuses to talk to.
//!
//! Partition tests must cut and heal the links between *live* processes, from outside them,
//! without root. A node started with [`NetConfig::block_list`](crate::NetConfig) re-reads
//! that file every [`POLL_INTERVAL`]; a peer listed there is refused on dial and on accept
//! (libp2p's `allow_block_list`) and its open connections are closed, so announcements and
//! blob fetches across the cut fail as they would in a real partition. Emptying the file
//! lifts the block; the node does not re-dial by itself on unblock: finding the other side
//! again is discovery's job, as after a real partition.
//!
//! Never enabled in normal runs (`atoll run --fault-injection` turns it on).
//!
//! Format: one peer id per line; blank lines and lines starting with `#` are ignored. A file
//! that does not parse (or is too large) leaves the block list as it was, with a warning,
//! so that a half-written file cannot heal a partition by accident; [`write`] replaces the
//! file atomically.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use libp2p::PeerId;

/// Name of the block-list file inside a run dir (what `atoll run --fault-injection` uses).
pub const FILE_NAME: &str = "blocked_peers";
/// How often the file is re-read.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Largest file read (about 5000 peer ids).
pub const MAX_FILE_BYTES: u64 = 256 * 1024;

/// Parses the block-list format; the error names the first bad line.
pub fn parse(text: &str) -> Result<HashSet<PeerId>, String> {
    let mut out = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let peer = line.parse::<PeerId>().map_err(|e| format!("line {}: {line:?}: {e}", i + 1))?;
        out.insert(peer);
    }
    Ok(out)
}

/// Reads a block-list file; a missing file is an empty list.
pub fn read(path: &Path) -> Result<HashSet<PeerId>, String> {
    match read_small(path)? {
        Some(text) => parse(&text),
        None => Ok(HashSet::new()),
    }
}

/// Reads a small text file of peer ids (block list, ban file): `None` if it does not exist,
/// an error if it is unreadable or larger than [`MAX_FILE_BYTES`].
pub(crate) fn read_small(path: &Path) -> Result<Option<String>, String> {
    let len = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    if len > MAX_FILE_BYTES {
        return Err(format!("{len} bytes, more than the {MAX_FILE_BYTES} read"));
    }
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// Replaces the block-list file atomically (temporary file, then rename) with `peers`.
pub fn write<'a>(path: &Path, peers: impl IntoIterator<Item = &'a PeerId>) -> std::io::Result<()> {
    let mut text = String::new();
    for p in peers {
        text.push_str(&p.to_string());
        text.push('\n');
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// What changed since the last poll.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// Newly listed: refuse and disconnect.
    pub block: Vec<PeerId>,
    /// No longer listed: accept again.
    pub unblock: Vec<PeerId>,
}

/// The block list a node enforces, and the file it comes from.
#[derive(Debug)]
pub struct BlockList {
    path: PathBuf,
    current: HashSet<PeerId>,
    /// The last read error, so that a broken file is reported once, not every second.
    last_error: Option<String>,
}

impl BlockList {
    pub fn new(path: PathBuf) -> Self {
        BlockList { path, current: HashSet::new(), last_error: None }
    }

    /// Re-reads the file and returns what changed; `None` when nothing did or the file
    /// cannot be used (the list then stays as it was).
    pub fn poll(&mut self) -> Option<Change> {
        match read(&self.path) {
            Ok(next) => {
                self.last_error = None;
                self.apply(next)
            }
            Err(e) => {
                if self.last_error.as_ref() != Some(&e) {
                    tracing::warn!(
                        path = %self.path.display(),
                        error = %e,
                        "fault injection: block list unreadable; keeping the previous one"
                    );
                    self.last_error = Some(e);
                }
                None
            }
        }
    }

    fn apply(&mut self, next: HashSet<PeerId>) -> Option<Change> {
        let mut change = Change {
            block: next.difference(&self.current).copied().collect(),
            unblock: self.current.difference(&next).copied().collect(),
        };
        if change.block.is_empty() && change.unblock.is_empty() {
            return None;
        }
        change.block.sort();
        change.unblock.sort();
        self.current = next;
        Some(change)
    }

    /// Peers currently blocked.
    pub fn len(&self) -> usize {
        self.current.len()
    }

    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_skips_blanks_and_comments_and_names_bad_lines() {
        let (a, b) = (PeerId::random(), PeerId::random());
        let text = format!("# cut\n{a}\n\n  {b}  \n{a}\n");
        assert_eq!(parse(&text).unwrap(), HashSet::from([a, b]));
        let err = parse(&format!("{a}\n12D3Koo")).unwrap_err();
        assert!(err.starts_with("line 2"), "{err}");
    }

    #[test]
    fn poll_reports_changes_once_and_keeps_the_list_on_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let mut list = BlockList::new(path.clone());
        assert_eq!(list.poll(), None, "a missing file is an empty list");
        let (a, b) = (PeerId::random(), PeerId::random());
        write(&path, [&a, &b]).unwrap();
        let mut both = vec![a, b];
        both.sort();
        assert_eq!(list.poll(), Some(Change { block: both, unblock: vec![] }));
        assert_eq!(list.poll(), None);
        std::fs::write(&path, "not a peer id\n").unwrap();
        assert_eq!(list.poll(), None);
        assert_eq!(list.len(), 2, "a bad file must not heal the partition");
        write(&path, [&b]).unwrap();
        assert_eq!(list.poll(), Some(Change { block: vec![], unblock: vec![a] }));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(list.poll(), Some(Change { block: vec![], unblock: vec![b] }));
        assert!(list.is_empty());
    }
}
