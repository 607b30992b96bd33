//! The run's heartbeat topic on the swarm task (see [`crate::heartbeat`]): publish ours,
//! check and rate-limit others' before the program sees them.

use std::time::Instant;

use bytes::Bytes;
use libp2p::{gossipsub, PeerId};

use super::event_loop::EventLoop;
use crate::client::NetEvent;
use crate::counters::RejectReason;
use crate::error::{AnnounceError, NetError};
use crate::heartbeat::{topic_name, FLOOD_STRIKE, MAX_HEARTBEAT_BYTES};

/// The gossipsub topic of a run's heartbeats.
pub(super) fn topic(run_name: &str) -> gossipsub::IdentTopic {
    gossipsub::IdentTopic::new(topic_name(run_name))
}

/// What to do with one received heartbeat.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// Hand it to the program and forward it.
    Deliver(PeerId),
    /// Larger than any heartbeat or unsigned: the forwarder should have dropped it.
    Malformed(RejectReason),
    /// Over its author's rate: dropped, not forwarded, the author struck.
    Flood(PeerId),
}

impl EventLoop {
    pub(super) fn publish_heartbeat(&mut self, payload: Vec<u8>) -> Result<(), NetError> {
        if payload.len() > MAX_HEARTBEAT_BYTES {
            let e = AnnounceError::Oversized { size: payload.len(), limit: MAX_HEARTBEAT_BYTES };
            return Err(e.into());
        }
        let len = payload.len() as u64;
        let topic = self.heartbeats.clone();
        self.swarm
            .behaviour_mut()
            .gossipsub
            .publish(topic, payload)
            .map_err(|e| NetError::Publish(e.to_string()))?;
        self.counters.announce.add_out(len);
        Ok(())
    }

    /// A message on the heartbeat topic. Returns the verdict for gossipsub.
    pub(super) fn on_heartbeat(
        &mut self,
        from: PeerId,
        author: Option<PeerId>,
        data: &[u8],
    ) -> gossipsub::MessageAcceptance {
        match verdict(data.len(), author, |a| self.hygiene.admit_heartbeat(a, Instant::now())) {
            Verdict::Deliver(author) => {
                let n = data.len() as u64;
                self.counters.announce.add_in(n);
                self.peers.add_bytes(from, 0, n);
                let payload = Bytes::copy_from_slice(data);
                self.emit(NetEvent::Heartbeat { author, payload });
                gossipsub::MessageAcceptance::Accept
            }
            Verdict::Flood(author) => {
                // Signed by its author, so the author is to blame, not the forwarder (which
                // may have seen it inside the rate: it is not penalised, only not heard).
                let why = "heartbeats over the author's rate limit";
                self.peers.reject(author.to_string(), RejectReason::HeartbeatRate, why);
                self.strike(author, RejectReason::HeartbeatRate.as_str(), FLOOD_STRIKE);
                gossipsub::MessageAcceptance::Ignore
            }
            Verdict::Malformed(reason) => {
                self.peers.reject(from.to_string(), reason, "bad heartbeat");
                // Honest forwarders check the size and the signature first: 4 strikes, as
                // for a malformed announcement.
                self.strike(from, reason.as_str(), 4.0);
                gossipsub::MessageAcceptance::Reject
            }
        }
    }
}

/// The checks, in order: size, signature, the author's rate (`admit` takes a token).
fn verdict(len: usize, author: Option<PeerId>, admit: impl FnOnce(PeerId) -> bool) -> Verdict {
    match author {
        _ if len > MAX_HEARTBEAT_BYTES => Verdict::Malformed(RejectReason::Oversized),
        None => Verdict::Malformed(RejectReason::Malformed),
        Some(a) if !admit(a) => Verdict::Flood(a),
        Some(a) => Verdict::Deliver(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_then_signature_then_rate() {
        let a = PeerId::random();
        let never = |_| panic!("no token taken for a message refused earlier");
        let big = MAX_HEARTBEAT_BYTES + 1;
        assert_eq!(verdict(big, Some(a), never), Verdict::Malformed(RejectReason::Oversized));
        assert_eq!(verdict(10, None, never), Verdict::Malformed(RejectReason::Malformed));
        assert_eq!(verdict(MAX_HEARTBEAT_BYTES, Some(a), |_| true), Verdict::Deliver(a));
        assert_eq!(verdict(10, Some(a), |_| false), Verdict::Flood(a));
    }
}
