//! Announcements: small, versioned messages on one gossipsub topic per run.
//!
//! The peer layer does not know what an announcement says (the protocol layer defines that);
//! it wraps opaque payload bytes in a small envelope that names the wire version:
//!
//! ```text
//! envelope = version:u16be payload[..]
//! ```
//!
//! The run is the topic's ([`topic_name`]): gossipsub hands a peer only messages of the
//! topics it joined, and the node refuses any other as another run's. Every announcement
//! reaches every peer several times (its gossip mesh), so the envelope and the topic name,
//! carried in each copy, are kept short: version 1 also spelled out a magic and the run's
//! name, and the topic was `atoll/<run>/announce` — 28 more bytes a copy for the demo's
//! run name, a tenth of a state announcement's gossipsub message (bench/RESULTS.md).
//!
//! The size limit is checked before anything is decoded; messages of another version are
//! rejected with a reason that the node counts.

use crate::error::AnnounceError;

/// Wire version of the envelope. Bump on any incompatible change.
pub const ANNOUNCE_VERSION: u16 = 2;
/// Largest encoded announcement (envelope + payload). Deltas never ride gossip: an
/// announcement names a blob by hash, so a few KiB is plenty.
pub const MAX_ANNOUNCE_BYTES: usize = 16 * 1024;
/// gossipsub's `max_transmit_size`: one RPC frame may batch several messages plus control
/// data, so it sits above [`MAX_ANNOUNCE_BYTES`]; frames above it are dropped by gossipsub.
/// Messages between the two limits reach our check and are counted as oversized.
pub const GOSSIP_MAX_TRANSMIT: usize = 64 * 1024;

const HEADER: usize = 2;
/// Highest envelope version read as a later generation's rather than as garbage.
const MAX_LATER_VERSION: u16 = 255;

/// The gossipsub topic of a run's announcements.
pub fn topic_name(run_name: &str) -> String {
    format!("{run_name}/a")
}

/// Wraps `payload`; fails if the result would exceed [`MAX_ANNOUNCE_BYTES`].
pub fn encode(payload: &[u8]) -> Result<Vec<u8>, AnnounceError> {
    let size = HEADER + payload.len();
    if size > MAX_ANNOUNCE_BYTES {
        return Err(AnnounceError::Oversized { size, limit: MAX_ANNOUNCE_BYTES });
    }
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&ANNOUNCE_VERSION.to_be_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

/// Checks and unwraps an announcement; returns the payload.
pub fn decode(data: &[u8]) -> Result<&[u8], AnnounceError> {
    if data.len() > MAX_ANNOUNCE_BYTES {
        return Err(AnnounceError::Oversized { size: data.len(), limit: MAX_ANNOUNCE_BYTES });
    }
    let Some((version, payload)) = data.split_first_chunk::<HEADER>() else {
        return Err(AnnounceError::Malformed("missing envelope header".into()));
    };
    let got = match u16::from_be_bytes(*version) {
        ANNOUNCE_VERSION => return Ok(payload),
        // The first envelope began with a magic; later ones count up from this one. Other
        // bytes are not an envelope at all (a strike of their own: no honest peer sends
        // them).
        _ if data.starts_with(b"ATLA") => 1,
        v if (ANNOUNCE_VERSION..=MAX_LATER_VERSION).contains(&v) => v,
        _ => return Err(AnnounceError::Malformed("not an envelope".into())),
    };
    Err(AnnounceError::WrongVersion { got, expected: ANNOUNCE_VERSION })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_by_reason() {
        let ok = encode(b"hello").unwrap();
        assert_eq!(ok.len(), 2 + 5);
        assert_eq!(decode(&ok).unwrap(), b"hello");
        let mut v3 = ok.clone();
        v3[1] = 3;
        assert!(matches!(decode(&v3), Err(AnnounceError::WrongVersion { got: 3, .. })));
        // Version 1's envelope ("ATLA" ...) is another version, not garbage.
        assert!(matches!(decode(b"ATLA\0\x01"), Err(AnnounceError::WrongVersion { got: 1, .. })));
        assert!(matches!(decode(b"j"), Err(AnnounceError::Malformed(_))));
        for garbage in [&[0u8, 0, 7][..], &[1, 1, 1], &[0xff, 0xff]] {
            assert!(matches!(decode(garbage), Err(AnnounceError::Malformed(_))), "{garbage:?}");
        }
        assert!(matches!(decode(b""), Err(AnnounceError::Malformed(_))));
        let big = vec![0u8; MAX_ANNOUNCE_BYTES + 1];
        assert!(matches!(decode(&big), Err(AnnounceError::Oversized { .. })));
        assert!(matches!(encode(&big), Err(AnnounceError::Oversized { .. })));
        assert_eq!(topic_name("atoll-demo"), "atoll-demo/a");
    }

    proptest! {
        #[test]
        fn round_trip(payload in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let enc = encode(&payload).unwrap();
            prop_assert_eq!(decode(&enc).unwrap(), &payload[..]);
        }

        #[test]
        fn garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&data);
        }
    }
}
