//! The outer-delta codec: what a peer sends when it contributes to a fragment's round.
//!
//! A delta is `anchor − local_params` for one fragment (DESIGN.md §2.3), a flat `f32`
//! buffer laid out by [`FragmentSpec`]. On the wire it is either quantised blockwise to 8 or
//! 4 bits with one f32 scale per block (§2.5: 4-bit loses nothing measurable, and the anchor
//! and the outer optimizer stay f32), or sparse: the `keep` largest values of each block with
//! 2- or 1-bit values ([`sparse`], as SparseLoCo). Either is optionally zstd-compressed,
//! prefixed by a versioned header ([`wire`]) and named by its blake3 hash ([`ContentHash`]).
//!
//! Error feedback: the part of a delta that quantisation rounds away (or that top-k leaves
//! out) is kept in [`ErrorFeedback`] and added to the next delta of the same fragment, so
//! nothing is lost in the long run, only delayed. It is part of the peer's state: the node
//! saves it beside the anchors, and a restarted peer continues it.
//!
//! Decoding treats the bytes as hostile: sizes are checked against the header, the
//! [`FragmentSpec`] and [`Limits`] before anything is allocated or decompressed, and the
//! result must be finite. How much a valid delta may move the anchor is the merge's
//! business (per-tensor clipping against the round's own median, `proto::merge`).

mod hash;
mod options;
mod quant;
mod sparse;
pub mod wire;

pub use hash::ContentHash;
pub use options::{Codec, EncodeOptions, Limits, BLOCK_RANGE};
pub use wire::{DELTA_WIRE_VERSION, HEADER_LEN};

use crate::fragment::FragmentSpec;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use wire::{Header, FLAG_ZSTD};

/// Who made a delta, for what, and how much work it holds; bound into the hashed bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeltaMeta {
    /// The protocol id of the peer that made the delta (see [`crate::proto::PeerId`]).
    pub author: u64,
    pub fragment: u32,
    pub round: u64,
    /// Tokens processed for this fragment since its previous contribution.
    pub tokens: u64,
    /// Inner steps since its previous contribution (≥ 1).
    pub steps: u64,
}

/// What one fragment's deltas have not sent (the quantisation or sparsification residual),
/// carried into its next delta (times [`EncodeOptions::feedback_decay`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorFeedback {
    residual: Vec<f32>,
}

impl ErrorFeedback {
    /// Zero residual for a fragment of `numel` values.
    pub fn new(numel: usize) -> Self {
        Self { residual: vec![0.0; numel] }
    }

    /// Continues a saved residual: `None` unless it has `numel` finite values.
    pub fn from_residual(residual: Vec<f32>, numel: usize) -> Option<Self> {
        (residual.len() == numel && residual.iter().all(|r| r.is_finite()))
            .then_some(Self { residual })
    }

    /// The residual that the next delta will carry.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Adds a whole delta to the residual (a snapshot not published: its work goes out
    /// with the next delta). `false`, and nothing changes, if the lengths differ.
    pub fn absorb(&mut self, delta: &[f32]) -> bool {
        if delta.len() != self.residual.len() {
            return false;
        }
        self.residual.iter_mut().zip(delta).for_each(|(r, d)| *r += d);
        true
    }

    /// Forgets the residual (e.g. after adopting another peer's anchor, where the residual
    /// refers to a lineage that no longer exists).
    pub fn clear(&mut self) {
        self.residual.iter_mut().for_each(|r| *r = 0.0);
    }
}

/// An encoded delta.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// The payload bytes (shared: the node stores and serves them as they are).
    pub bytes: Bytes,
    pub hash: ContentHash,
    /// Exactly what every receiver decodes; the sender merges this, not its raw delta.
    pub values: Vec<f32>,
}

/// A decoded, validated delta.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub meta: DeltaMeta,
    pub codec: Codec,
    pub values: Vec<f32>,
    /// L2 norm of `values` (f64 accumulation in index order, so it is reproducible).
    pub norm: f32,
}

/// Why encoding failed (only on caller bugs: sizes that do not fit the wire).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    #[error("block size {0} outside {BLOCK_RANGE:?}")]
    BadBlock(usize),
    #[error("keep {keep} outside 1..={block} (the block size)")]
    BadKeep { keep: usize, block: usize },
    #[error("feedback_decay {0} outside [0, 1]")]
    BadDecay(f32),
    #[error("delta of {0} values does not fit the wire format")]
    TooLarge(usize),
    #[error("delta holds a non-finite value at index {0}")]
    NonFinite(usize),
    #[error("delta has {got} values but the feedback residual has {want}")]
    FeedbackLength { got: usize, want: usize },
    #[error("steps must be at least 1")]
    ZeroSteps,
    #[error("zstd failed: {0}")]
    Compress(String),
}

/// Why a payload was refused. Every variant is the sender's fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("payload of {len} bytes is shorter than the header")]
    Truncated { len: usize },
    #[error("payload of {len} bytes exceeds the limit of {limit}")]
    TooLarge { len: usize, limit: usize },
    #[error("not a delta payload (bad magic)")]
    BadMagic,
    #[error("unsupported delta wire version {0}")]
    UnsupportedVersion(u16),
    #[error("unknown codec tag {0}")]
    UnknownCodec(u8),
    #[error("unknown flag bits {0:#x}")]
    UnknownFlags(u8),
    #[error("delta is for fragment {got}, expected {want}")]
    WrongFragment { got: u32, want: usize },
    #[error("delta has {got} values, fragment {fragment} has {want}")]
    WrongLength { fragment: usize, got: u32, want: usize },
    #[error("invalid block size {0}")]
    BadBlock(u32),
    #[error("invalid keep {keep} for blocks of {block}")]
    BadKeep { keep: u32, block: u32 },
    #[error("body length {got} does not match the expected {want}")]
    BodyLength { got: usize, want: usize },
    #[error("zero steps")]
    ZeroSteps,
    #[error("corrupt body: {0}")]
    Corrupt(&'static str),
    #[error("decompression failed: {0}")]
    Decompress(String),
    #[error("non-finite value at index {0}")]
    NonFinite(usize),
}

/// Encodes `delta` (+ the carried residual when `feedback` is given) for the wire, and
/// updates the residual to what this encoding rounded away.
pub fn encode(
    meta: DeltaMeta,
    delta: &[f32],
    feedback: Option<&mut ErrorFeedback>,
    opts: &EncodeOptions,
) -> Result<Encoded, EncodeError> {
    opts.check()?;
    if meta.steps == 0 {
        return Err(EncodeError::ZeroSteps);
    }
    let numel = u32::try_from(delta.len()).map_err(|_| EncodeError::TooLarge(delta.len()))?;
    let mut x = delta.to_vec();
    if let Some(fb) = feedback.as_deref() {
        if fb.residual.len() != delta.len() {
            return Err(EncodeError::FeedbackLength { got: delta.len(), want: fb.residual.len() });
        }
        x.iter_mut().zip(&fb.residual).for_each(|(v, r)| *v += r);
    }
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(EncodeError::NonFinite(i));
    }
    let keep = opts.wire_keep();
    // The top-k encoder returns what receivers will decode; the others' bytes are decoded.
    let (block, raw, sent) = match opts.codec {
        Codec::F32 => (0, x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(), None),
        c if c.is_sparse() => {
            let mut body = Vec::new();
            let sent = sparse::encode(&x, opts.block, keep, c.bits(), &mut body);
            (opts.block, body, Some(sent))
        }
        c => {
            let mut body = Vec::new();
            quant::quantise(&x, opts.block, c.bits(), &mut body);
            (opts.block, body, None)
        }
    };
    let values = match sent {
        Some(values) => values,
        None => body_values(opts.codec, &raw, delta.len(), block, keep)
            .map_err(|_| EncodeError::NonFinite(0))?,
    };
    // A block whose absmax is near f32::MAX can dequantise to ±inf (code × scale rounds
    // up): refuse it here, before the residual is touched, rather than publish a payload
    // every receiver refuses.
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Err(EncodeError::NonFinite(i));
    }
    if let Some(fb) = feedback {
        let decay = opts.feedback_decay;
        let rest = fb.residual.iter_mut().zip(x.iter().zip(&values));
        rest.for_each(|(r, (a, b))| *r = decay * (a - b));
    }
    let stored = compress(&raw, opts.zstd_level)?;
    let raw_len = u32::try_from(raw.len()).map_err(|_| EncodeError::TooLarge(delta.len()))?;
    let header = Header {
        codec: opts.codec,
        flags: if stored.is_some() { FLAG_ZSTD } else { 0 },
        fragment: meta.fragment,
        round: meta.round,
        tokens: meta.tokens,
        steps: meta.steps,
        numel,
        block: block as u32,
        keep: keep as u32,
        raw_len,
        stored_len: stored.as_ref().map_or(raw_len, |s| s.len() as u32),
        author: meta.author,
    };
    let body = stored.as_deref().unwrap_or(&raw);
    let mut bytes = Vec::with_capacity(HEADER_LEN + body.len());
    header.write(&mut bytes);
    bytes.extend_from_slice(body);
    let hash = ContentHash::of(&bytes);
    Ok(Encoded { bytes: bytes.into(), hash, values })
}

/// zstd-compresses `raw` when that helps; `None` means "store raw".
fn compress(raw: &[u8], level: i32) -> Result<Option<Vec<u8>>, EncodeError> {
    if level == 0 {
        return Ok(None);
    }
    let c = zstd::bulk::compress(raw, level).map_err(|e| EncodeError::Compress(e.to_string()))?;
    Ok((c.len() < raw.len()).then_some(c))
}

/// Largest payload `encode` writes for a delta of `numel` values under `opts` (header
/// included; zstd is kept only when it shrinks the body, so this bounds it).
pub fn max_encoded_len(numel: usize, opts: &EncodeOptions) -> Option<usize> {
    max_raw_len(opts.codec, numel, opts.block, opts.wire_keep())?.checked_add(HEADER_LEN)
}

/// Largest payload `decode` accepts for a fragment of `numel` values, whatever the codec:
/// the header and an f32 body (the largest; a compressed body must be smaller than its raw
/// one). An announcement of more bytes for that fragment can only be a lie.
pub fn largest_payload(numel: usize) -> u64 {
    (HEADER_LEN as u64).saturating_add((numel as u64).saturating_mul(4))
}

/// Raw body length the header may declare for `codec`, `numel`, `block` and `keep`: exactly
/// this for the dense codecs, at most this for the sparse ones (their length depends on
/// where the kept values are).
fn max_raw_len(codec: Codec, numel: usize, block: usize, keep: usize) -> Option<usize> {
    match codec {
        Codec::F32 => numel.checked_mul(4),
        c if c.is_sparse() => sparse::max_body_len(numel, block, keep, c.bits()),
        c => quant::body_len(numel, block, c.bits()),
    }
}

/// Turns a raw (uncompressed, length-checked) body into values.
fn body_values(
    codec: Codec,
    raw: &[u8],
    numel: usize,
    block: usize,
    keep: usize,
) -> Result<Vec<f32>, DecodeError> {
    match codec {
        Codec::F32 => {
            Ok(raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
        }
        c if c.is_sparse() => {
            sparse::decode(raw, numel, block, keep, c.bits()).map_err(|f| match f {
                sparse::SparseFault::BadLevel => DecodeError::Corrupt("bad block level"),
                sparse::SparseFault::BadStream => DecodeError::Corrupt("bad sparse code stream"),
            })
        }
        c => quant::dequantise(raw, numel, block, c.bits()).map_err(|f| match f {
            quant::BodyFault::BadScale => DecodeError::Corrupt("bad block scale"),
            quant::BodyFault::BadCode => DecodeError::Corrupt("reserved 4-bit code"),
        }),
    }
}

/// Decodes and validates a payload for fragment `spec`. Never panics on any input.
pub fn decode(bytes: &[u8], spec: &FragmentSpec, limits: &Limits) -> Result<Decoded, DecodeError> {
    if bytes.len() > limits.max_payload_bytes {
        return Err(DecodeError::TooLarge { len: bytes.len(), limit: limits.max_payload_bytes });
    }
    let h = Header::parse(bytes)?;
    if h.fragment as usize != spec.id {
        return Err(DecodeError::WrongFragment { got: h.fragment, want: spec.id });
    }
    let numel = spec.numel();
    if h.numel as usize != numel {
        return Err(DecodeError::WrongLength { fragment: spec.id, got: h.numel, want: numel });
    }
    if h.steps == 0 {
        return Err(DecodeError::ZeroSteps);
    }
    let block = h.block as usize;
    let block_ok = match h.codec {
        Codec::F32 => block == 0,
        _ => BLOCK_RANGE.contains(&block),
    };
    if !block_ok {
        return Err(DecodeError::BadBlock(h.block));
    }
    let keep = h.keep as usize;
    let keep_ok = if h.codec.is_sparse() { (1..=block).contains(&keep) } else { keep == 0 };
    if !keep_ok {
        return Err(DecodeError::BadKeep { keep: h.keep, block: h.block });
    }
    // Both lengths are checked before anything is allocated or decompressed.
    let bound = max_raw_len(h.codec, numel, block, keep).unwrap_or(usize::MAX);
    let raw_ok =
        if h.codec.is_sparse() { h.raw_len as usize <= bound } else { h.raw_len as usize == bound };
    if !raw_ok {
        return Err(DecodeError::BodyLength { got: h.raw_len as usize, want: bound });
    }
    let want_raw = h.raw_len as usize;
    let stored = &bytes[HEADER_LEN..];
    if stored.len() != h.stored_len as usize {
        return Err(DecodeError::BodyLength { got: stored.len(), want: h.stored_len as usize });
    }
    if h.flags & FLAG_ZSTD != 0 && stored.len() >= want_raw {
        // The encoder keeps zstd only when it shrinks the body; anything else (padding,
        // skippable frames) would let a payload exceed `largest_payload`.
        return Err(DecodeError::Corrupt("compressed body not smaller than the raw one"));
    }
    let decompressed;
    let raw: &[u8] = if h.flags & FLAG_ZSTD != 0 {
        // Capacity is the declared raw length: zstd fails instead of growing past it.
        decompressed = zstd::bulk::decompress(stored, want_raw)
            .map_err(|e| DecodeError::Decompress(e.to_string()))?;
        &decompressed
    } else {
        stored
    };
    if raw.len() != want_raw {
        return Err(DecodeError::BodyLength { got: raw.len(), want: want_raw });
    }
    let values = body_values(h.codec, raw, numel, block, keep)?;
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Err(DecodeError::NonFinite(i));
    }
    let norm = l2_norm(&values);
    let meta = DeltaMeta {
        author: h.author,
        fragment: h.fragment,
        round: h.round,
        tokens: h.tokens,
        steps: h.steps,
    };
    Ok(Decoded { meta, codec: h.codec, values, norm })
}

/// L2 norm with f64 accumulation in index order (reproducible on every machine).
pub fn l2_norm(v: &[f32]) -> f32 {
    v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt() as f32
}

#[cfg(test)]
mod tests;
