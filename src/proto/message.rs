//! Gossip messages (DESIGN.md §3.2): small, versioned, JSON in an envelope.
//!
//! Announcements are the only thing that rides gossip; payloads (deltas, anchor states)
//! are pulled by content hash. JSON keeps them readable in logs and is a few hundred bytes
//! at most, which is noise next to the payloads.

use crate::delta::ContentHash;
use serde::{Deserialize, Serialize};

/// Version of the message format; carried in every envelope and in the topic name.
pub const PROTOCOL_VERSION: u16 = 1;
/// Gossip topic prefix; the node appends the run id.
pub const TOPIC_PREFIX: &str = "/atoll/proto/1/";
/// Largest encoded message accepted; checked before parsing.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// A peer as the protocol sees it. The node derives it from the libp2p peer id (e.g. the
/// first 8 bytes of its blake3) and keeps the map back to the real id; the core only needs
/// identities to count votes and pick sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PeerId(pub u64);

/// "I hold a delta for fragment `fragment` of round `round`; fetch it by `hash`."
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContributionAnnounce {
    pub fragment: u32,
    pub round: u64,
    pub hash: ContentHash,
    /// Payload size in bytes, so a receiver can refuse oversize payloads before fetching.
    pub size: u64,
    pub tokens: u64,
    pub steps: u64,
    /// The peer that made the delta (a relay re-announcing it keeps this).
    pub origin: PeerId,
    /// Hash of the state the delta was taken against, and its round: doubles as a vote
    /// for reconciliation, so a (re)starting peer learns where the swarm is from the next
    /// announcement of any peer.
    pub base: ContentHash,
    pub base_round: u64,
}

/// "After round `round`, my state of fragment `fragment` hashes to `hash`."
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateAnnounce {
    pub fragment: u32,
    pub round: u64,
    pub hash: ContentHash,
    pub size: u64,
    /// How many contributions the merge that made the state took: between states held by
    /// as many voters, the one merged from more contributions wins reconciliation. A claim
    /// checked against the state's own log when the state is fetched or recomputed; a
    /// holder caught claiming another count loses its vote.
    /// (Optional so that announcements of peers that predate the count still parse.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub took: Option<u32>,
    /// How the state was made, when its merge took at most [`MAX_RECIPE_IDS`]
    /// contributions: a peer that holds the parent and the contributions recomputes it
    /// (the merge is deterministic) instead of fetching it. A claim like any other: the
    /// result counts only if it hashes to `hash`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipe: Option<Recipe>,
}

/// Most contributions a [`Recipe`] lists: a state announcement with that many of the
/// longest ids stays under [`MAX_MESSAGE_BYTES`] (checked by a test). Raised from 64, which
/// a 64-peer swarm's merges outgrow with their late deltas; a peer with the older bound
/// ignores a longer recipe, as it ignores any it cannot use.
pub const MAX_RECIPE_IDS: usize = 160;

/// A state's parent and the short ids (sorted) of the contributions its last merge took.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Recipe {
    pub parent: ContentHash,
    pub merged: Vec<u64>,
}

/// Everything the protocol gossips.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    Contribution(ContributionAnnounce),
    State(StateAnnounce),
}

impl Message {
    /// The fragment the message is about.
    pub fn fragment(&self) -> u32 {
        match self {
            Message::Contribution(c) => c.fragment,
            Message::State(s) => s.fragment,
        }
    }

    /// The hash of the payload the message announces.
    pub fn payload_hash(&self) -> crate::delta::ContentHash {
        match self {
            Message::Contribution(c) => c.hash,
            Message::State(s) => s.hash,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    v: u16,
    msg: Message,
}

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    #[error("message of {0} bytes exceeds {MAX_MESSAGE_BYTES}")]
    TooLarge(usize),
    #[error("message is not valid: {0}")]
    Malformed(String),
    #[error("protocol version {0} is not supported (this peer speaks {PROTOCOL_VERSION})")]
    Version(u16),
}

/// Encodes a message for gossip.
pub fn encode_message(msg: &Message) -> Vec<u8> {
    // Serialising plain structs with string keys cannot fail.
    serde_json::to_vec(&Envelope { v: PROTOCOL_VERSION, msg: msg.clone() }).unwrap_or_default()
}

/// Decodes a gossiped message; the size is checked before parsing.
pub fn decode_message(bytes: &[u8]) -> Result<Message, MessageError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(MessageError::TooLarge(bytes.len()));
    }
    #[derive(Deserialize)]
    struct Version {
        v: u16,
    }
    let v: Version =
        serde_json::from_slice(bytes).map_err(|e| MessageError::Malformed(e.to_string()))?;
    if v.v != PROTOCOL_VERSION {
        return Err(MessageError::Version(v.v));
    }
    let env: Envelope =
        serde_json::from_slice(bytes).map_err(|e| MessageError::Malformed(e.to_string()))?;
    Ok(env.msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_version_check() {
        let m = Message::State(StateAnnounce {
            fragment: 2,
            round: 9,
            hash: ContentHash::of(b"s"),
            size: 10,
            took: None,
            recipe: None,
        });
        let bytes = encode_message(&m);
        assert!(bytes.len() < 200);
        assert_eq!(decode_message(&bytes).unwrap(), m);
        let v2 = String::from_utf8(bytes).unwrap().replace("\"v\":1", "\"v\":2");
        assert_eq!(decode_message(v2.as_bytes()), Err(MessageError::Version(2)));
        assert!(matches!(decode_message(&[b' '; 5000]), Err(MessageError::TooLarge(_))));
    }

    #[test]
    fn the_longest_recipe_fits_a_message() {
        let m = Message::State(StateAnnounce {
            fragment: u32::MAX,
            round: u64::MAX,
            hash: ContentHash::of(b"s"),
            size: u64::MAX,
            took: Some(u32::MAX),
            recipe: Some(Recipe {
                parent: ContentHash::of(b"p"),
                merged: (0..MAX_RECIPE_IDS as u64).map(|i| u64::MAX - i).rev().collect(),
            }),
        });
        let bytes = encode_message(&m);
        assert!(bytes.len() <= MAX_MESSAGE_BYTES, "{} bytes", bytes.len());
        assert_eq!(decode_message(&bytes).unwrap(), m);
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode_message(&bytes);
        }
    }
}
