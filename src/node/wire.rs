//! The node's gossip payload: the run id (blake3 of the manifest) and a protocol message.
//!
//! ```text
//! run_id[32] ‖ proto message (crate::proto::encode_message)
//! ```

use crate::proto::{decode_message, encode_message, Message};

/// Wraps a protocol message of run `run_id`.
pub fn encode(run_id: &[u8; 32], msg: &Message) -> Vec<u8> {
    let body = encode_message(msg);
    let mut out = Vec::with_capacity(32 + body.len());
    out.extend_from_slice(run_id);
    out.extend_from_slice(&body);
    out
}

/// Splits a payload into its run id and message. The message is decoded even when the run
/// differs, so a foreign peer is told apart from a broken one.
pub fn decode(payload: &[u8]) -> Result<([u8; 32], Message), String> {
    if payload.len() < 32 {
        return Err(format!("payload of {} bytes is shorter than a run id", payload.len()));
    }
    let (run, body) = payload.split_at(32);
    let msg = decode_message(body).map_err(|e| e.to_string())?;
    let mut id = [0u8; 32];
    id.copy_from_slice(run);
    Ok((id, msg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::ContentHash;
    use crate::proto::StateAnnounce;

    #[test]
    fn round_trip_and_garbage() {
        let msg = Message::State(StateAnnounce {
            fragment: 1,
            round: 4,
            hash: ContentHash::of(b"x"),
            size: 9,
            took: None,
            recipe: None,
            parent: None,
        });
        let bytes = encode(&[7; 32], &msg);
        assert_eq!(decode(&bytes).unwrap(), ([7; 32], msg));
        assert!(decode(&bytes[..20]).is_err());
        assert!(decode(&[0u8; 40]).is_err());
    }
}
