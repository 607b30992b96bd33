//! Member records: run peers say where they can be reached, in signed gossip.
//!
//! Discovery by the DHT alone can be eclipsed: ids are free, and two dozen ids ground next
//! to the run key hold every provider record of the run and answer every lookup with
//! nobody, while their full k-bucket keeps honest members out of the routing tables that
//! answer FIND_NODE. A newcomer that reached one honest member would then never learn of
//! the others. So every member also publishes, every [`RECORD_EVERY`] (more seldom in
//! larger runs: [`record_every`]) and soon after a new member connects, a small record of
//! its listen addresses on the run's members topic, signed like every gossip message.
//! Gossip reaches the newcomer through the one honest
//! member it has; the record's author is a member, and its addresses go into the same
//! bounded dial queue as providers' (at most two addresses each, a few dials per tick), so
//! a record cannot turn peers into a dialling botnet.
//!
//! ```text
//! record = "ATLM" count:u8 (len:u16be multiaddr[len]){count}
//! ```

use std::time::{Duration, Instant};

use libp2p::{gossipsub, Multiaddr, PeerId};
use tracing::debug;

use super::event_loop::EventLoop;
use crate::counters::RejectReason;

const MAGIC: &[u8; 4] = b"ATLM";
/// Addresses a record may carry.
pub const MAX_RECORD_ADDRS: usize = 8;
/// Largest record on the wire.
pub const MAX_RECORD_BYTES: usize = 1024;
/// How often a member of a small run publishes its record ([`record_every`]).
pub const RECORD_EVERY: Duration = Duration::from_secs(10);
/// The longest gap between a member's records in a large run (provider lookups find
/// members too: `EventLoop::discover`).
const RECORD_EVERY_MAX: Duration = Duration::from_secs(60);

/// The gap between a member's records when it is connected to `members` run peers: one
/// second per member of the run ([`crate::heartbeat::spread`]), 10 s to a minute.
pub fn record_every(members: usize) -> Duration {
    crate::heartbeat::spread(members.saturating_add(1), RECORD_EVERY, RECORD_EVERY_MAX)
}
/// After a new member connects, the next record goes out this soon (once its
/// subscription had time to reach us).
pub const RECORD_SOON: Duration = Duration::from_secs(1);

/// The gossipsub topic of a run's member records.
pub fn members_topic(run_name: &str) -> gossipsub::IdentTopic {
    gossipsub::IdentTopic::new(format!("{run_name}/m"))
}

/// Encodes up to [`MAX_RECORD_ADDRS`] addresses (fewer if the record would grow too big).
pub fn encode(addrs: &[Multiaddr]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.push(0);
    for a in addrs.iter().take(MAX_RECORD_ADDRS) {
        let bytes = a.to_vec();
        if out.len() + 2 + bytes.len() > MAX_RECORD_BYTES {
            break;
        }
        out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
        out.extend_from_slice(&bytes);
        out[4] += 1;
    }
    out
}

/// Decodes a record; `None` for anything malformed. Never panics.
pub fn decode(bytes: &[u8]) -> Option<Vec<Multiaddr>> {
    if bytes.len() > MAX_RECORD_BYTES || bytes.get(..4)? != MAGIC {
        return None;
    }
    let count = *bytes.get(4)? as usize;
    if count > MAX_RECORD_ADDRS {
        return None;
    }
    let mut rest = &bytes[5..];
    let mut addrs = Vec::with_capacity(count);
    for _ in 0..count {
        let len = u16::from_be_bytes([*rest.first()?, *rest.get(1)?]) as usize;
        let addr = rest.get(2..2 + len)?;
        addrs.push(Multiaddr::try_from(addr.to_vec()).ok()?);
        rest = &rest[2 + len..];
    }
    rest.is_empty().then_some(addrs)
}

impl EventLoop {
    /// Publishes our record when it is due (a discovery tick).
    pub(super) fn publish_record(&mut self, now: Instant) {
        if self.record_due.is_some_and(|at| at > now) {
            return;
        }
        let mut addrs: Vec<Multiaddr> = Vec::new();
        for a in self.swarm.external_addresses().chain(self.swarm.listeners()) {
            let unspecified = a
                .iter()
                .any(|p| matches!(p, libp2p::multiaddr::Protocol::Ip4(ip) if ip.is_unspecified()));
            if !unspecified && !addrs.contains(a) {
                addrs.push(a.clone());
            }
        }
        if addrs.is_empty() {
            return;
        }
        let data = encode(&addrs);
        let len = data.len() as u64;
        let topic = self.members.clone();
        match self.swarm.behaviour_mut().gossipsub.publish(topic, data) {
            Ok(_) => {
                self.counters.announce.add_out(len);
                self.record_due = Some(now + record_every(self.peers.members.len()));
            }
            // Nobody subscribed yet: try again next tick.
            Err(e) => debug!(error = %e, "member record not published"),
        }
    }

    /// A new member connected: it hears our record soon, not a whole period later.
    pub(super) fn record_soon(&mut self, now: Instant) {
        let soon = now + RECORD_SOON;
        if self.record_due.is_none_or(|at| at > soon) {
            self.record_due = Some(soon);
        }
    }

    /// A record on the members topic: its signed author is a member at these addresses.
    /// Returns the verdict for gossipsub.
    pub(super) fn on_record(
        &mut self,
        from: PeerId,
        author: Option<PeerId>,
        data: &[u8],
    ) -> gossipsub::MessageAcceptance {
        let (Some(author), Some(addrs)) = (author, decode(data)) else {
            self.peers.reject(from.to_string(), RejectReason::Malformed, "malformed member record");
            self.strike(from, RejectReason::Malformed.as_str(), 4.0);
            return gossipsub::MessageAcceptance::Reject;
        };
        self.counters.announce.add_in(data.len() as u64);
        self.learn_member(author, Some(addrs));
        gossipsub::MessageAcceptance::Accept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_records_come_about_once_a_second_up_to_a_minute_apart() {
        assert_eq!(record_every(0), RECORD_EVERY);
        assert_eq!(record_every(9), RECORD_EVERY);
        assert_eq!(record_every(15), Duration::from_secs(16));
        assert_eq!(record_every(10_000), RECORD_EVERY_MAX);
        assert_eq!(record_every(usize::MAX), RECORD_EVERY_MAX);
    }

    #[test]
    fn records_round_trip_and_junk_is_refused() {
        let addrs: Vec<Multiaddr> =
            (0..10).map(|i| format!("/ip4/10.0.0.{i}/tcp/4001").parse().unwrap()).collect();
        let bytes = encode(&addrs);
        assert_eq!(decode(&bytes).unwrap(), addrs[..MAX_RECORD_ADDRS].to_vec());
        assert_eq!(decode(&encode(&[])).unwrap(), Vec::<Multiaddr>::new());
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_none(), "truncated at {cut}");
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(decode(&trailing).is_none());
        let mut bad = bytes.clone();
        bad[7] = 0xff; // first address bytes: not a multiaddr protocol code
        assert!(decode(&bad).is_none());
        let mut many = bytes;
        many[4] = MAX_RECORD_ADDRS as u8 + 1;
        assert!(decode(&many).is_none());
    }
}
