//! A group member's announcement on gossip: its buffer for a step, and whom its group
//! still holds. Fixed length; anything else is not an announcement.

use atoll_net::BlobHash;

const MAGIC: &[u8; 4] = b"ATCL";
/// magic, run id, step, attempt, members, hash, length, previous step's hash.
const WIRE_LEN: usize = 4 + 32 + 8 + 8 + 8 + 32 + 8 + 32;

/// One announcement: this member's buffer for `step`, and whom its group still holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Wire {
    pub run: [u8; 32],
    pub step: u64,
    /// Bit `i`: the `i`-th member at formation is still in the author's group.
    pub members: u64,
    pub hash: BlobHash,
    pub len: u64,
    /// The author's buffer of `step − 1` (none at its first step).
    pub prev: Option<BlobHash>,
}

impl Wire {
    pub fn encode(&self, attempt: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(WIRE_LEN);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.run);
        out.extend_from_slice(&self.step.to_le_bytes());
        // Makes every re-announcement a new gossip message (identical ones are deduplicated).
        out.extend_from_slice(&attempt.to_le_bytes());
        out.extend_from_slice(&self.members.to_le_bytes());
        out.extend_from_slice(&self.hash.0);
        out.extend_from_slice(&self.len.to_le_bytes());
        // All zeros: none (a real blake3 hash of zeros is not a concern at these odds).
        out.extend_from_slice(&self.prev.map_or([0; 32], |h| h.0));
        out
    }

    pub fn decode(b: &[u8]) -> Option<Wire> {
        if b.len() != WIRE_LEN || &b[..4] != MAGIC {
            return None;
        }
        let u64_at = |at: usize| b.get(at..at + 8)?.try_into().ok().map(u64::from_le_bytes);
        let run: [u8; 32] = b[4..36].try_into().ok()?;
        let hash: [u8; 32] = b[60..92].try_into().ok()?;
        let (step, members, len) = (u64_at(36)?, u64_at(52)?, u64_at(92)?);
        let prev: [u8; 32] = b[100..132].try_into().ok()?;
        let prev = (prev != [0; 32]).then_some(BlobHash(prev));
        Some(Wire { run, step, members, hash: BlobHash(hash), len, prev })
    }
}
