//! Contributions a peer holds, kept encoded, and their decoding for a merge (or for
//! recomputing another peer's merge, src/proto/evidence.rs).

use super::fasthash::FastMap;
use super::merge::Input;
use super::{PeerId, Settings};
use crate::delta::{self, ContentHash, Limits};
use crate::fragment::FragmentSpec;
use bytes::Bytes;

/// A contribution this peer holds: pending, or merged recently (kept so that it can be
/// served, and re-queued if an adopted state turns out not to contain it).
#[derive(Debug, Clone)]
pub(crate) struct Held {
    /// The author: named in the delta's hashed header and equal to the gossip signer of
    /// its announcement.
    pub origin: PeerId,
    pub round: u64,
    pub tokens: u64,
    pub steps: u64,
    /// The payload, encoded: decoded values would cost 8× the bytes of a 4-bit delta (a
    /// 200-byte zstd zero delta decodes to hundreds of KB), so it is decoded again at the
    /// merge.
    pub bytes: Bytes,
    /// Round this peer's lineage merged it in.
    pub merged_at: Option<u64>,
}

/// A held contribution decoded for a merge: hash, author, weighed tokens and steps, values.
pub(crate) type Decoded = (ContentHash, PeerId, u64, u64, Vec<f32>);

/// Decodes the contributions `hashes` names out of `held` (one lane's, whose fragment is
/// `spec`), in the order given. Held payloads passed every check on arrival; decoding them
/// again cannot fail unless memory was corrupted, and such a payload is simply left out.
pub(crate) fn decode(
    held: &FastMap<ContentHash, Held>,
    spec: &FragmentSpec,
    hashes: &[ContentHash],
    settings: &Settings,
    limits: &Limits,
) -> Vec<Decoded> {
    let max_steps = settings.max_weighted_steps();
    hashes
        .iter()
        .filter_map(|hash| {
            let h = held.get(hash)?;
            let d = delta::decode(&h.bytes, spec, limits).ok()?;
            // A claim of more steps than a round allows weighs as if it held the bound,
            // tokens scaled alike (claims were checked against the manifest).
            let steps = h.steps.min(max_steps);
            let tokens =
                (u128::from(h.tokens) * u128::from(steps) / u128::from(h.steps.max(1))) as u64;
            Some((*hash, h.origin, tokens, steps, d.values))
        })
        .collect()
}

/// The merge's view of decoded contributions.
pub(crate) fn merge_inputs(decoded: &[Decoded]) -> Vec<Input<'_>> {
    decoded
        .iter()
        .map(|(hash, author, tokens, steps, values)| Input {
            hash: *hash,
            author: *author,
            tokens: *tokens,
            steps: *steps,
            values,
        })
        .collect()
}
