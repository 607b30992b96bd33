//! The delta payload's fixed header (version 3, little-endian).
//!
//! ```text
//! offset size field
//!  0      4   magic "ATDL"
//!  4      2   version (3)
//!  6      1   codec (0 f32, 1 q8, 2 q4, 3 top2, 4 top1)
//!  7      1   flags (bit 0: body is zstd-compressed; other bits must be 0)
//!  8      4   fragment id
//! 12      8   round the delta was published for
//! 20      8   tokens since the fragment's previous contribution
//! 28      8   inner steps since the fragment's previous contribution
//! 36      4   numel (values in the fragment)
//! 40      4   block size (0 for f32)
//! 44      4   raw body length (after decompression)
//! 48      4   stored body length (must equal the bytes that follow)
//! 52      8   author: the protocol id of the peer that made the delta
//! 60      4   keep: values sent per block (sparse codecs; 0 for the dense ones)
//! ```
//! Author, round, tokens and steps live inside the hashed bytes, so the weight a delta gets
//! in the merge and the peer it is credited to are bound to its content address: whoever
//! relays or re-announces it cannot change them, and a receiver checks them against the
//! signed announcement (the gossip signer must be the author).

use super::{Codec, DecodeError};

pub(crate) const MAGIC: [u8; 4] = *b"ATDL";
/// Version of the delta wire format; bump on any layout change.
pub const DELTA_WIRE_VERSION: u16 = 3;
/// Bytes before the body.
pub const HEADER_LEN: usize = 64;
pub(crate) const FLAG_ZSTD: u8 = 1;

/// The header's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub codec: Codec,
    pub flags: u8,
    pub fragment: u32,
    pub round: u64,
    pub tokens: u64,
    pub steps: u64,
    pub numel: u32,
    pub block: u32,
    pub keep: u32,
    pub raw_len: u32,
    pub stored_len: u32,
    pub author: u64,
}

impl Header {
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&DELTA_WIRE_VERSION.to_le_bytes());
        out.push(self.codec.tag());
        out.push(self.flags);
        out.extend_from_slice(&self.fragment.to_le_bytes());
        out.extend_from_slice(&self.round.to_le_bytes());
        out.extend_from_slice(&self.tokens.to_le_bytes());
        out.extend_from_slice(&self.steps.to_le_bytes());
        out.extend_from_slice(&self.numel.to_le_bytes());
        out.extend_from_slice(&self.block.to_le_bytes());
        out.extend_from_slice(&self.raw_len.to_le_bytes());
        out.extend_from_slice(&self.stored_len.to_le_bytes());
        out.extend_from_slice(&self.author.to_le_bytes());
        out.extend_from_slice(&self.keep.to_le_bytes());
    }

    /// Parses the header; checks only what needs no outside knowledge.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() < HEADER_LEN {
            return Err(DecodeError::Truncated { len: bytes.len() });
        }
        if bytes[0..4] != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]);
        let u32_at =
            |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let version = u16_at(4);
        if version != DELTA_WIRE_VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let codec = Codec::from_tag(bytes[6]).ok_or(DecodeError::UnknownCodec(bytes[6]))?;
        let flags = bytes[7];
        if flags & !FLAG_ZSTD != 0 {
            return Err(DecodeError::UnknownFlags(flags));
        }
        Ok(Self {
            codec,
            flags,
            fragment: u32_at(8),
            round: u64_at(12),
            tokens: u64_at(20),
            steps: u64_at(28),
            numel: u32_at(36),
            block: u32_at(40),
            raw_len: u32_at(44),
            stored_len: u32_at(48),
            author: u64_at(52),
            keep: u32_at(60),
        })
    }
}
