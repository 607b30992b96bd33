//! Announcements: small, versioned messages on one gossipsub topic per run.
//!
//! The peer layer does not know what an announcement says (the protocol layer defines that);
//! it wraps opaque payload bytes in a small envelope that names the wire version and the run:
//!
//! ```text
//! envelope = "ATLA" version:u16be run_len:u8 run_name[run_len] payload[..]
//! ```
//!
//! The size limit is checked before anything is decoded; messages of another run or version
//! are rejected with a reason that the node counts.

use crate::error::AnnounceError;

/// Wire version of the envelope. Bump on any incompatible change.
pub const ANNOUNCE_VERSION: u16 = 1;
/// Largest encoded announcement (envelope + payload). Deltas never ride gossip: an
/// announcement names a blob by hash, so a few KiB is plenty.
pub const MAX_ANNOUNCE_BYTES: usize = 16 * 1024;
/// gossipsub's `max_transmit_size`: one RPC frame may batch several messages plus control
/// data, so it sits above [`MAX_ANNOUNCE_BYTES`]; frames above it are dropped by gossipsub.
/// Messages between the two limits reach our check and are counted as oversized.
pub const GOSSIP_MAX_TRANSMIT: usize = 64 * 1024;

const MAGIC: &[u8; 4] = b"ATLA";
const HEADER: usize = 4 + 2 + 1;

/// The gossipsub topic of a run.
pub fn topic_name(run_name: &str) -> String {
    format!("atoll/{run_name}/announce")
}

/// Wraps `payload` for `run_name`; fails if the result would exceed [`MAX_ANNOUNCE_BYTES`].
pub fn encode(run_name: &str, payload: &[u8]) -> Result<Vec<u8>, AnnounceError> {
    let run = run_name.as_bytes();
    let run_len = u8::try_from(run.len())
        .map_err(|_| AnnounceError::Malformed("run name longer than 255 bytes".into()))?;
    let size = HEADER + run.len() + payload.len();
    if size > MAX_ANNOUNCE_BYTES {
        return Err(AnnounceError::Oversized { size, limit: MAX_ANNOUNCE_BYTES });
    }
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&ANNOUNCE_VERSION.to_be_bytes());
    out.push(run_len);
    out.extend_from_slice(run);
    out.extend_from_slice(payload);
    Ok(out)
}

/// Checks and unwraps an announcement of `run_name`; returns the payload.
pub fn decode<'a>(run_name: &str, data: &'a [u8]) -> Result<&'a [u8], AnnounceError> {
    if data.len() > MAX_ANNOUNCE_BYTES {
        return Err(AnnounceError::Oversized { size: data.len(), limit: MAX_ANNOUNCE_BYTES });
    }
    if data.len() < HEADER || &data[..4] != MAGIC {
        return Err(AnnounceError::Malformed("missing envelope header".into()));
    }
    let version = u16::from_be_bytes([data[4], data[5]]);
    if version != ANNOUNCE_VERSION {
        return Err(AnnounceError::WrongVersion { got: version, expected: ANNOUNCE_VERSION });
    }
    let run_len = data[6] as usize;
    let Some(run) = data.get(HEADER..HEADER + run_len) else {
        return Err(AnnounceError::Malformed("truncated run name".into()));
    };
    if run != run_name.as_bytes() {
        return Err(AnnounceError::WrongRun {
            got: String::from_utf8_lossy(run).into_owned(),
            expected: run_name.to_string(),
        });
    }
    Ok(&data[HEADER + run_len..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_by_reason() {
        let ok = encode("r1", b"hello").unwrap();
        assert_eq!(decode("r1", &ok).unwrap(), b"hello");
        assert!(matches!(decode("r2", &ok), Err(AnnounceError::WrongRun { .. })));
        let mut v2 = ok.clone();
        v2[5] = 2;
        assert!(matches!(decode("r1", &v2), Err(AnnounceError::WrongVersion { got: 2, .. })));
        assert!(matches!(decode("r1", b"junk"), Err(AnnounceError::Malformed(_))));
        let mut trunc = ok.clone();
        trunc[6] = 200;
        assert!(matches!(decode("r1", &trunc), Err(AnnounceError::Malformed(_))));
        let big = vec![0u8; MAX_ANNOUNCE_BYTES + 1];
        assert!(matches!(decode("r1", &big), Err(AnnounceError::Oversized { .. })));
        assert!(matches!(encode("r1", &big), Err(AnnounceError::Oversized { .. })));
    }

    proptest! {
        #[test]
        fn round_trip(run in "[a-z0-9-]{1,40}", payload in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let enc = encode(&run, &payload).unwrap();
            prop_assert_eq!(decode(&run, &enc).unwrap(), &payload[..]);
        }

        #[test]
        fn garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode("run", &data);
        }
    }
}
