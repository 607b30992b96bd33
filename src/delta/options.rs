//! The codec's settings: which codec, its block and `keep`, and the bounds a receiver
//! applies before decoding.

use super::EncodeError;
use serde::{Deserialize, Serialize};

/// How delta values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// Raw little-endian f32 (for ablations and debugging).
    F32,
    /// 8-bit blockwise.
    Q8,
    /// 4-bit blockwise (DESIGN.md §3.4; [`EncodeOptions::default`]). The default run sends
    /// `Top2` (`atoll::manifest::default_encode`).
    Q4,
    /// Top-k per block ([`EncodeOptions::keep`]) with 2-bit values: a sign and one of two
    /// magnitudes per block.
    Top2,
    /// Top-k per block with 1-bit values: a sign, at the block's mean kept magnitude.
    Top1,
}

impl Codec {
    pub(crate) fn tag(self) -> u8 {
        match self {
            Codec::F32 => 0,
            Codec::Q8 => 1,
            Codec::Q4 => 2,
            Codec::Top2 => 3,
            Codec::Top1 => 4,
        }
    }

    pub(crate) fn from_tag(tag: u8) -> Option<Self> {
        match tag {
            0 => Some(Codec::F32),
            1 => Some(Codec::Q8),
            2 => Some(Codec::Q4),
            3 => Some(Codec::Top2),
            4 => Some(Codec::Top1),
            _ => None,
        }
    }

    pub(crate) fn bits(self) -> u32 {
        match self {
            Codec::F32 => 32,
            Codec::Q8 => 8,
            Codec::Q4 => 4,
            Codec::Top2 => 2,
            Codec::Top1 => 1,
        }
    }

    /// Sends only the largest values of each block.
    pub fn is_sparse(self) -> bool {
        matches!(self, Codec::Top2 | Codec::Top1)
    }
}

/// Smallest and largest quantisation block accepted on the wire.
pub const BLOCK_RANGE: std::ops::RangeInclusive<usize> = 8..=65_536;

/// Encoder settings. An unknown field is refused, so a misspelt setting in a manifest
/// is an error rather than a default.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncodeOptions {
    pub codec: Codec,
    /// Values per scale; within [`BLOCK_RANGE`]. 64 costs 1/16 byte per value in scales.
    pub block: usize,
    /// zstd level; 0 stores the body raw. zstd is kept only when it makes the body smaller.
    pub zstd_level: i32,
    /// Sparse codecs: values sent per block, in `1..=block` (64 of 4096 is SparseLoCo's
    /// 1.56%). Ignored (and written 0 on the wire) by the dense ones.
    #[serde(default = "default_keep")]
    pub keep: usize,
    /// Share of what a delta did not send that its error feedback carries into the next
    /// one, in `[0, 1]`: 1 carries all of it (also when a manifest leaves it out); below 1
    /// the unsent rest fades, as in SparseLoCo's error feedback. A peer restarts every
    /// round from the merged anchor and learns much of what it did not send again, so with
    /// sparse codecs a full residual sends that work twice (bench/RESULTS.md, "Error
    /// feedback that fades"); the default run's sparse codec keeps 0.8.
    #[serde(default = "whole", skip_serializing_if = "is_whole")]
    pub feedback_decay: f32,
}

fn default_keep() -> usize {
    64
}

fn whole() -> f32 {
    1.0
}

/// Left out of a manifest while it keeps its default, so a manifest written before the
/// setting existed keeps its canonical JSON and run id.
fn is_whole(v: &f32) -> bool {
    *v == 1.0
}

/// 4-bit blockwise codes of 64 values, zstd level 3, a full residual.
impl Default for EncodeOptions {
    fn default() -> Self {
        Self {
            codec: Codec::Q4,
            block: 64,
            zstd_level: 3,
            keep: default_keep(),
            feedback_decay: whole(),
        }
    }
}

impl EncodeOptions {
    /// Why these options cannot be encoded, if they cannot.
    pub fn check(&self) -> Result<(), EncodeError> {
        if self.codec != Codec::F32 && !BLOCK_RANGE.contains(&self.block) {
            return Err(EncodeError::BadBlock(self.block));
        }
        if self.codec.is_sparse() && !(1..=self.block).contains(&self.keep) {
            return Err(EncodeError::BadKeep { keep: self.keep, block: self.block });
        }
        if !(0.0..=1.0).contains(&self.feedback_decay) {
            return Err(EncodeError::BadDecay(self.feedback_decay));
        }
        Ok(())
    }

    /// What is written in the header's `keep` field.
    pub(crate) fn wire_keep(&self) -> usize {
        if self.codec.is_sparse() {
            self.keep
        } else {
            0
        }
    }
}

/// Bounds applied before decoding anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Largest payload accepted, header included.
    pub max_payload_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        // 256 MiB: an f32 fragment of 64M parameters; far above atoll's CPU-sized models.
        Self { max_payload_bytes: 256 << 20 }
    }
}
