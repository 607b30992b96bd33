//! Content addresses: every payload (delta, anchor state) is named by the blake3 hash of its
//! bytes, so a peer can fetch it from anyone and verify it on arrival (DESIGN.md §3.2).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// blake3 hash of a payload's exact bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ContentHash(pub [u8; 32]);

impl ContentHash {
    /// Hashes `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(*blake3::hash(bytes).as_bytes())
    }

    /// First 8 bytes as an integer: the compact id a state's recipe lists (a gossip message
    /// has room for 64 of them). Not collision-proof against someone grinding ~2^32 payloads,
    /// so nothing that judges a peer rests on it: a recipe whose ids are ambiguous is not
    /// used, and a state's own log holds whole hashes.
    pub fn short(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(b)
    }

    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Option<Self> {
        let bytes = s.as_bytes();
        if bytes.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            out[i] = (hi * 16 + lo) as u8;
        }
        Some(Self(out))
    }
}

/// All 32 bytes: an announcement may name any bytes as a hash, so keys sharing a prefix
/// must not share a bucket (the maps are keyed per process, see `proto::fasthash`).
impl std::hash::Hash for ContentHash {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(&self.0);
    }
}

impl fmt::Debug for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Eight hex digits are enough to tell hashes apart in logs and test failures.
        write!(f, "#{}", &self.to_hex()[..8])
    }
}

impl fmt::Display for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Serialize for ContentHash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for ContentHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::from_hex(&s).ok_or_else(|| serde::de::Error::custom("expected 64 hex digits"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_serde() {
        let h = ContentHash::of(b"atoll");
        assert_eq!(ContentHash::from_hex(&h.to_hex()), Some(h));
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(serde_json::from_str::<ContentHash>(&json).unwrap(), h);
        assert!(ContentHash::from_hex("zz").is_none());
        assert!(serde_json::from_str::<ContentHash>("\"00\"").is_err());
    }
}
