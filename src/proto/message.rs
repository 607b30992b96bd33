//! Gossip messages (DESIGN.md §3.2): small, versioned, fixed-layout binary.
//!
//! Announcements are the only thing that rides gossip; payloads (deltas, anchor states)
//! are pulled by content hash. Every peer receives every announcement and forwards it to
//! its gossip mesh, so their bytes are a large share of a peer's traffic once deltas are
//! sparse: the layout is plain little-endian fields, about a third of the former JSON
//! (version 1). Logs show the decoded message.
//!
//! ```text
//! version u16 ‖ type u8 ‖ fields
//! contribution (1): fragment u32 ‖ round u64 ‖ hash [32] ‖ size u64 ‖ tokens u64
//!                   ‖ steps u64 ‖ origin u64 ‖ base [32] ‖ base_round u64
//! state (2):        fragment u32 ‖ round u64 ‖ hash [32] ‖ size u64 ‖ flags u8
//!                   ‖ took u32 (flag 1) ‖ parent [32] ‖ n u16 ‖ n × id u64 (flag 2)
//!                   ‖ parent [32] (flag 4)
//! ```
//!
//! Version 3 added the state's parent (flag 4); a version-2 peer refuses it as another
//! version, not as a malformed message.

use crate::cursor::{Cursor, Short};
use crate::delta::ContentHash;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Version of the message format; carried in every envelope and in the topic name.
pub const PROTOCOL_VERSION: u16 = 3;
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
    /// The state the merge that made this one started from. A claim, checked when the
    /// state is fetched (a holder that named another parent loses its vote): it lets a peer
    /// that cannot recompute a state weigh it by its lineage — how many of the round's
    /// voters hold states made on the same parent — rather than by its own holders alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ContentHash>,
}

/// Most contributions a [`Recipe`] lists: a state announcement with that many of the
/// longest ids stays under [`MAX_MESSAGE_BYTES`] (checked by a test). Raised from 64, which
/// a 64-peer swarm's merges outgrow with their late deltas; a peer with the older bound
/// ignores a longer recipe, as it ignores any it cannot use.
pub const MAX_RECIPE_IDS: usize = 160;

/// A state's parent and the short ids (sorted) of the contributions its last merge took.
/// The ids are shared, not copied: every voter's recipe table keeps the announcement's
/// list, and a simulated gossip hands one message to thousands of peers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Recipe {
    pub parent: ContentHash,
    pub merged: Arc<[u64]>,
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

const CONTRIBUTION: u8 = 1;
const STATE: u8 = 2;
/// [`StateAnnounce`] flags: which optional fields follow.
const HAS_TOOK: u8 = 1;
const HAS_RECIPE: u8 = 2;
const HAS_PARENT: u8 = 4;

/// Encodes a message for gossip (the layout is in the module's documentation).
pub fn encode_message(msg: &Message) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    match msg {
        Message::Contribution(c) => {
            out.push(CONTRIBUTION);
            out.extend_from_slice(&c.fragment.to_le_bytes());
            out.extend_from_slice(&c.round.to_le_bytes());
            out.extend_from_slice(&c.hash.0);
            for n in [c.size, c.tokens, c.steps, c.origin.0] {
                out.extend_from_slice(&n.to_le_bytes());
            }
            out.extend_from_slice(&c.base.0);
            out.extend_from_slice(&c.base_round.to_le_bytes());
        }
        Message::State(s) => {
            out.push(STATE);
            out.extend_from_slice(&s.fragment.to_le_bytes());
            out.extend_from_slice(&s.round.to_le_bytes());
            out.extend_from_slice(&s.hash.0);
            out.extend_from_slice(&s.size.to_le_bytes());
            let flags = if s.took.is_some() { HAS_TOOK } else { 0 }
                | if s.recipe.is_some() { HAS_RECIPE } else { 0 }
                | if s.parent.is_some() { HAS_PARENT } else { 0 };
            out.push(flags);
            if let Some(took) = s.took {
                out.extend_from_slice(&took.to_le_bytes());
            }
            if let Some(r) = &s.recipe {
                out.extend_from_slice(&r.parent.0);
                // A recipe longer than a u16 cannot be announced; the bound is far lower.
                let n = r.merged.len().min(u16::MAX as usize);
                out.extend_from_slice(&(n as u16).to_le_bytes());
                for id in &r.merged[..n] {
                    out.extend_from_slice(&id.to_le_bytes());
                }
            }
            if let Some(parent) = &s.parent {
                out.extend_from_slice(&parent.0);
            }
        }
    }
    out
}

/// Decodes a gossiped message; the size is checked before parsing, and every byte must be
/// part of the message.
pub fn decode_message(bytes: &[u8]) -> Result<Message, MessageError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(MessageError::TooLarge(bytes.len()));
    }
    // Version 1 was a JSON object.
    if bytes.first() == Some(&b'{') {
        return Err(MessageError::Version(1));
    }
    let mut r = Cursor::new(bytes);
    let v = r.u16_le()?;
    if v != PROTOCOL_VERSION {
        return Err(MessageError::Version(v));
    }
    let msg = match r.u8()? {
        CONTRIBUTION => Message::Contribution(ContributionAnnounce {
            fragment: r.u32_le()?,
            round: r.u64_le()?,
            hash: ContentHash(r.array()?),
            size: r.u64_le()?,
            tokens: r.u64_le()?,
            steps: r.u64_le()?,
            origin: PeerId(r.u64_le()?),
            base: ContentHash(r.array()?),
            base_round: r.u64_le()?,
        }),
        STATE => {
            let (fragment, round, hash, size) =
                (r.u32_le()?, r.u64_le()?, ContentHash(r.array()?), r.u64_le()?);
            let flags = r.u8()?;
            if flags & !(HAS_TOOK | HAS_RECIPE | HAS_PARENT) != 0 {
                return Err(malformed(format!("unknown state flags {flags:#04x}")));
            }
            let took = if flags & HAS_TOOK != 0 { Some(r.u32_le()?) } else { None };
            let recipe = if flags & HAS_RECIPE != 0 {
                let parent = ContentHash(r.array()?);
                // Any count the message holds: a recipe longer than this peer's bound is
                // ignored where recipes are used (`note_recipe`), not refused here, so a
                // later bound can grow without its messages being refused.
                let n = r.u16_le()? as usize;
                let merged = (0..n).map(|_| r.u64_le()).collect::<Result<_, _>>()?;
                Some(Recipe { parent, merged })
            } else {
                None
            };
            let parent = if flags & HAS_PARENT != 0 { Some(ContentHash(r.array()?)) } else { None };
            Message::State(StateAnnounce { fragment, round, hash, size, took, recipe, parent })
        }
        t => return Err(malformed(format!("unknown message type {t}"))),
    };
    if r.remaining() > 0 {
        return Err(malformed(format!("{} bytes after the message", r.remaining())));
    }
    Ok(msg)
}

fn malformed(why: String) -> MessageError {
    MessageError::Malformed(why)
}

/// The unread rest of a message.
impl From<Short> for MessageError {
    fn from(s: Short) -> Self {
        malformed(format!("message ends {} bytes early", s.missing))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn state(took: Option<u32>, recipe: Option<Recipe>) -> Message {
        Message::State(StateAnnounce {
            fragment: 2,
            round: 9,
            hash: ContentHash::of(b"s"),
            size: 10,
            took,
            recipe,
            parent: Some(ContentHash::of(b"parent")),
        })
    }

    fn contribution() -> Message {
        Message::Contribution(ContributionAnnounce {
            fragment: 3,
            round: 1 << 40,
            hash: ContentHash::of(b"d"),
            size: 859,
            tokens: 640,
            steps: 10,
            origin: PeerId(u64::MAX - 5),
            base: ContentHash::of(b"b"),
            base_round: (1 << 40) - 1,
        })
    }

    fn examples() -> Vec<Message> {
        let recipe = Recipe { parent: ContentHash::of(b"p"), merged: vec![1, 5, u64::MAX].into() };
        vec![
            contribution(),
            state(None, None),
            state(Some(4), None),
            state(None, Some(recipe.clone())),
            state(Some(3), Some(recipe)),
            state(Some(0), Some(Recipe { parent: ContentHash::of(b"q"), merged: Arc::new([]) })),
        ]
    }

    #[test]
    fn round_trip_and_version_check() {
        for m in examples() {
            let bytes = encode_message(&m);
            assert!(bytes.len() < 160, "{} bytes: {m:?}", bytes.len());
            assert_eq!(decode_message(&bytes).unwrap(), m);
            let mut next = bytes.clone();
            let v = PROTOCOL_VERSION + 1;
            next[..2].copy_from_slice(&v.to_le_bytes());
            assert_eq!(decode_message(&next), Err(MessageError::Version(v)));
        }
        // A peer of the JSON format (version 1) is told apart from a broken one.
        let v1 = br#"{"v":1,"msg":{"type":"state","fragment":2}}"#;
        assert_eq!(decode_message(v1), Err(MessageError::Version(1)));
        assert!(matches!(decode_message(&[b' '; 5000]), Err(MessageError::TooLarge(_))));
    }

    #[test]
    fn a_cut_extended_or_unknown_message_is_malformed() {
        for m in examples() {
            let bytes = encode_message(&m);
            for cut in 2..bytes.len() {
                let got = decode_message(&bytes[..cut]);
                assert!(matches!(got, Err(MessageError::Malformed(_))), "cut {cut}: {got:?}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(matches!(decode_message(&longer), Err(MessageError::Malformed(_))));
            let mut unknown = bytes.clone();
            unknown[2] = 9;
            assert!(matches!(decode_message(&unknown), Err(MessageError::Malformed(_))));
        }
        let bare = |m: Message| match m {
            Message::State(s) => Message::State(StateAnnounce { parent: None, ..s }),
            m => m,
        };
        let mut flags = encode_message(&bare(state(None, None)));
        let at = flags.len() - 1;
        flags[at] = 8;
        assert!(matches!(decode_message(&flags), Err(MessageError::Malformed(_))));
        // A count of more ids than the message holds is cut short.
        let mut many = encode_message(&bare(state(
            None,
            Some(Recipe { parent: ContentHash::of(b"p"), merged: vec![7].into() }),
        )));
        let at = many.len() - 10;
        many[at..at + 2].copy_from_slice(&2u16.to_le_bytes());
        assert!(matches!(decode_message(&many), Err(MessageError::Malformed(_))));
        // A recipe over this peer's bound still decodes (its user ignores it).
        let long = Recipe { parent: ContentHash::of(b"p"), merged: (0..200).collect() };
        let m = state(None, Some(long));
        assert_eq!(decode_message(&encode_message(&m)), Ok(m));
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
            parent: Some(ContentHash::of(b"p")),
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

        #[test]
        fn every_state_round_trips(
            fragment in any::<u32>(),
            round in any::<u64>(),
            size in any::<u64>(),
            took in any::<Option<u32>>(),
            ids in prop::option::of(prop::collection::vec(any::<u64>(), 0..MAX_RECIPE_IDS)),
            seed in any::<u64>(),
            parent in any::<Option<[u8; 32]>>(),
        ) {
            let m = Message::State(StateAnnounce {
                fragment,
                round,
                hash: ContentHash::of(&seed.to_le_bytes()),
                size,
                took,
                recipe: ids.map(|merged| Recipe { parent: ContentHash::of(&[1]), merged: merged.into() }),
                parent: parent.map(ContentHash),
            });
            let bytes = encode_message(&m);
            prop_assert!(bytes.len() <= MAX_MESSAGE_BYTES);
            prop_assert_eq!(decode_message(&bytes), Ok(m));
        }
    }
}
