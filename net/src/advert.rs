//! What a node tells every peer about itself in identify's agent version, and how a
//! remote's agent version is read back.
//!
//! A joiner given `RUN_ID@ADDR` must learn which run the peer at ADDR serves before it
//! fetches anything, so that a wrong run id is refused with both ids named. identify
//! already runs on every connection and its messages are bounded by libp2p (4 KiB), so
//! the run's manifest hash rides in the agent version: `atoll-net/0.1.0 manifest/<hex>`.
//! The remote's agent version is written by an attacker: only an exact `manifest/` token
//! of 64 hex digits is read, anything else means "not told".

use crate::blob::BlobHash;

/// Prefix of the manifest token in the agent version.
const MANIFEST_TOKEN: &str = "manifest/";

/// Our agent version: the crate version, and the run's manifest hash when we serve one.
pub fn agent_version(manifest: Option<BlobHash>) -> String {
    let base = format!("atoll-net/{}", env!("CARGO_PKG_VERSION"));
    match manifest {
        Some(h) => format!("{base} {MANIFEST_TOKEN}{}", h.to_hex()),
        None => base,
    }
}

/// The manifest hash a remote's agent version names, if it names exactly one well-formed
/// one.
pub fn manifest_of(agent_version: &str) -> Option<BlobHash> {
    let mut found =
        agent_version.split_ascii_whitespace().filter_map(|t| t.strip_prefix(MANIFEST_TOKEN));
    let hex = found.next()?;
    if found.next().is_some() || hex.len() != 64 {
        return None;
    }
    BlobHash::from_hex(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_hash_round_trips_and_junk_is_not_told() {
        let h = BlobHash::of(b"manifest");
        assert_eq!(manifest_of(&agent_version(Some(h))), Some(h));
        assert_eq!(manifest_of(&agent_version(None)), None);
        let hex = h.to_hex();
        for junk in [
            String::new(),
            "manifest/".to_string(),
            format!("manifest/{}", &hex[..63]),
            format!("manifest/{hex}0"),
            format!("manifest/{}", hex.replace(|c: char| c.is_ascii_digit(), "g")),
            format!("manifest/{hex} manifest/{hex}"),
            "x".repeat(5000),
        ] {
            assert_eq!(manifest_of(&junk), None, "{junk}");
        }
    }
}
