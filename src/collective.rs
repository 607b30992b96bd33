//! A synchronous group over the network: the all-reduce of the baselines atoll is measured
//! against (data-parallel: gradients every inner step; synchronous DiLoCo: outer deltas
//! every H steps).
//!
//! Each member stores its buffer as a payload, announces `(step, hash, length)` on the
//! run's gossip topic (again every second until everyone's is in: a subscription may not
//! have reached everyone yet), fetches every other member's buffer and takes the mean in
//! member order (sorted peer ids), so every member computes the same bits. Strict: a step
//! waits for every member up to the timeout, then fails. Elastic: members missing at the
//! timeout leave the group and the step goes on with the rest (what elastic data-parallel
//! does when a worker dies). Bytes travel through atoll-net like atoll's own deltas, so
//! they are counted, capped and reported the same way.

use std::collections::BTreeMap;
use std::time::Duration;

use atoll_net::{BlobHash, NetEvent, PeerId};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::node::Network;

const MAGIC: &[u8; 4] = b"ATCL";
/// magic, run id, step, attempt, hash, length.
const WIRE_LEN: usize = 4 + 32 + 8 + 8 + 32 + 8;
/// How often a member announces its buffer again while it waits.
const REANNOUNCE: Duration = Duration::from_secs(1);

/// Why a group could not form or a step could not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveError {
    #[error("only {found} of the other {want} peers joined within {waited:?}")]
    Form { found: usize, want: usize, waited: Duration },
    #[error("step {step}: {missing} member(s) sent nothing within {waited:?} (strict barrier)")]
    Barrier { step: u64, missing: usize, waited: Duration },
    #[error("step {step}: the buffer of {peer}: {reason}")]
    Fetch { step: u64, peer: PeerId, reason: String },
    #[error("the network has shut down")]
    Closed,
}

/// One synchronous group.
pub struct Group<N> {
    net: N,
    events: mpsc::Receiver<NetEvent>,
    run: [u8; 32],
    me: PeerId,
    members: Vec<PeerId>,
    elastic: bool,
    timeout: Duration,
    /// Announcements heard: `(step, peer) → (hash, length)`, for this step and the next.
    heard: BTreeMap<(u64, PeerId), (BlobHash, u64)>,
    step: u64,
}

impl<N: Network> Group<N> {
    /// Waits until `size − 1` other peers of the run are connected; they and this peer are
    /// the group.
    pub async fn form(
        net: N,
        mut events: mpsc::Receiver<NetEvent>,
        run: [u8; 32],
        size: usize,
        elastic: bool,
        timeout: Duration,
    ) -> Result<Group<N>, CollectiveError> {
        let me = net.peer_id();
        let want = size.saturating_sub(1);
        let mut others: Vec<PeerId> = Vec::new();
        let deadline = Instant::now() + timeout;
        while others.len() < want {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Some(NetEvent::RunPeerJoined(p))) if p != me && !others.contains(&p) => {
                    others.push(p)
                }
                Ok(Some(_)) => {}
                Ok(None) => return Err(CollectiveError::Closed),
                Err(_) => {
                    let found = others.len();
                    return Err(CollectiveError::Form { found, want, waited: timeout });
                }
            }
        }
        let mut members = others;
        members.push(me);
        members.sort();
        let heard = BTreeMap::new();
        Ok(Group { net, events, run, me, members, elastic, timeout, heard, step: 0 })
    }

    /// The members, sorted (this peer included).
    pub fn members(&self) -> &[PeerId] {
        &self.members
    }

    /// The mean over the group of every member's `values` for `step` (steps increase).
    pub async fn mean(&mut self, step: u64, values: &[f32]) -> Result<Vec<f32>, CollectiveError> {
        self.step = step;
        self.heard.retain(|(s, _), _| *s >= step);
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let len = bytes.len() as u64;
        let hash = BlobHash::of(&bytes);
        self.net.put_blob(Bytes::from(bytes)).map_err(|_| CollectiveError::Closed)?;
        self.heard.insert((step, self.me), (hash, len));
        let deadline = Instant::now() + self.timeout;
        let mut attempt = 0u64;
        let mut announce_at = Instant::now();
        loop {
            let missing: Vec<PeerId> = self
                .members
                .iter()
                .filter(|p| !self.heard.contains_key(&(step, **p)))
                .copied()
                .collect();
            if missing.is_empty() {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                if !self.elastic {
                    let (n, waited) = (missing.len(), self.timeout);
                    return Err(CollectiveError::Barrier { step, missing: n, waited });
                }
                tracing::warn!(
                    step,
                    ?missing,
                    "members sent nothing in time; going on without them"
                );
                self.members.retain(|p| !missing.contains(p));
                break;
            }
            if now >= announce_at {
                let msg = encode(&self.run, step, attempt, &hash, len);
                if let Err(e) = self.net.publish(msg).await {
                    tracing::debug!(error = %e, step, "announcement not published yet");
                }
                attempt += 1;
                announce_at = now + REANNOUNCE;
            }
            let wake = announce_at.min(deadline);
            match tokio::time::timeout_at(wake, self.events.recv()).await {
                Ok(Some(ev)) => self.on_event(ev),
                Ok(None) => return Err(CollectiveError::Closed),
                Err(_) => {}
            }
        }
        self.reduce(step, values).await
    }

    fn on_event(&mut self, ev: NetEvent) {
        let NetEvent::Announcement { author: Some(author), payload, .. } = ev else { return };
        let Some((run, step, hash, len)) = decode(&payload) else { return };
        let fresh = step == self.step || step == self.step + 1;
        if run == self.run && fresh && self.members.contains(&author) {
            self.heard.insert((step, author), (hash, len));
        }
    }

    /// Fetches the other members' buffers (all at once) and averages in member order.
    async fn reduce(&mut self, step: u64, mine: &[f32]) -> Result<Vec<f32>, CollectiveError> {
        let want = 4 * mine.len() as u64;
        let mut fetches = tokio::task::JoinSet::new();
        for &peer in &self.members {
            if peer == self.me {
                continue;
            }
            let Some(&(hash, len)) = self.heard.get(&(step, peer)) else { continue };
            // The announced length bounds the transfer: anything but ours is refused unread.
            if len != want {
                let reason = format!("announced {len} bytes, expected {want}");
                return Err(CollectiveError::Fetch { step, peer, reason });
            }
            let net = self.net.clone();
            fetches.spawn(async move { (peer, len, net.fetch(hash, vec![peer], len).await) });
        }
        let mut buffers: BTreeMap<PeerId, Vec<f32>> = BTreeMap::new();
        while let Some(done) = fetches.join_next().await {
            let Ok((peer, len, got)) = done else { return Err(CollectiveError::Closed) };
            let fail = |reason: String| CollectiveError::Fetch { step, peer, reason };
            let bytes = got.map_err(|e| fail(e.to_string()))?;
            if bytes.len() as u64 != len {
                return Err(fail(format!("{} bytes, expected {len}", bytes.len())));
            }
            let values = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            buffers.insert(peer, values);
        }
        buffers.insert(self.me, mine.to_vec());
        let mut sum = vec![0f64; mine.len()];
        for values in buffers.values() {
            for (s, v) in sum.iter_mut().zip(values) {
                *s += f64::from(*v);
            }
        }
        let n = buffers.len() as f64;
        Ok(sum.into_iter().map(|s| (s / n) as f32).collect())
    }
}

fn encode(run: &[u8; 32], step: u64, attempt: u64, hash: &BlobHash, len: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(WIRE_LEN);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(run);
    out.extend_from_slice(&step.to_le_bytes());
    // Makes every re-announcement a new gossip message (identical ones are deduplicated).
    out.extend_from_slice(&attempt.to_le_bytes());
    out.extend_from_slice(&hash.0);
    out.extend_from_slice(&len.to_le_bytes());
    out
}

fn decode(b: &[u8]) -> Option<([u8; 32], u64, BlobHash, u64)> {
    if b.len() != WIRE_LEN || &b[..4] != MAGIC {
        return None;
    }
    let u64_at = |at: usize| b.get(at..at + 8)?.try_into().ok().map(u64::from_le_bytes);
    let run: [u8; 32] = b[4..36].try_into().ok()?;
    let hash: [u8; 32] = b[52..84].try_into().ok()?;
    Some((run, u64_at(36)?, BlobHash(hash), u64_at(84)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::memnet::MemSwarm;
    use atoll_net::Keypair;

    fn peer(i: u8) -> PeerId {
        Keypair::ed25519_from_bytes([i; 32]).unwrap().public().to_peer_id()
    }

    #[test]
    fn the_wire_round_trips_and_refuses_garbage() {
        let msg = encode(&[7; 32], 5, 2, &BlobHash([9; 32]), 1234);
        assert_eq!(decode(&msg), Some(([7; 32], 5, BlobHash([9; 32]), 1234)));
        assert_eq!(decode(&msg[..msg.len() - 1]), None);
        assert_eq!(decode(b"ATCL"), None);
        let mut bad = msg.clone();
        bad[0] = b'X';
        assert_eq!(decode(&bad), None);
    }

    #[tokio::test]
    async fn an_announced_length_other_than_ours_is_refused_before_any_transfer() {
        let swarm = MemSwarm::new();
        let (a, b) = (peer(1), peer(2));
        let (net_a, events_a) = swarm.join(a);
        let (net_b, _events_b) = swarm.join(b);
        let timeout = Duration::from_secs(10);
        let mut g = Group::form(net_a, events_a, [1; 32], 2, false, timeout).await.unwrap();
        // B announces a buffer of a gigabyte for step 0 (and holds nothing).
        net_b.publish(encode(&[1; 32], 0, 0, &BlobHash([5; 32]), 1 << 30)).await.unwrap();
        match g.mean(0, &[1.0, 2.0]).await {
            Err(CollectiveError::Fetch { peer, reason, .. }) => {
                assert_eq!(peer, b);
                assert!(reason.contains("announced 1073741824 bytes, expected 8"), "{reason}");
            }
            other => panic!("expected a refused length, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_member_gets_the_same_mean_and_elastic_groups_drop_the_silent() {
        let swarm = MemSwarm::new();
        let ids: Vec<PeerId> = (1..=3).map(peer).collect();
        let joined: Vec<_> = ids.iter().map(|p| swarm.join(*p)).collect();
        let timeout = Duration::from_secs(10);
        let mut tasks = tokio::task::JoinSet::new();
        for (i, (net, events)) in joined.into_iter().enumerate() {
            tasks.spawn(async move {
                let mut g = Group::form(net, events, [1; 32], 3, true, timeout).await.unwrap();
                let mut out = Vec::new();
                for step in 0..3u64 {
                    let values = vec![i as f32 + step as f32, 1.0 / (i as f32 + 1.0)];
                    out.push(g.mean(step, &values).await.unwrap());
                }
                // Member 2 stops; the other two go on without it after the timeout.
                if i < 2 {
                    g.timeout = Duration::from_millis(300);
                    out.push(g.mean(3, &[i as f32, 0.0]).await.unwrap());
                    assert_eq!(g.members().len(), 2);
                }
                (i, out)
            });
        }
        let mut results = BTreeMap::new();
        while let Some(r) = tasks.join_next().await {
            let (i, out) = r.unwrap();
            results.insert(i, out);
        }
        for step in 0..3 {
            let want = [1.0 + step as f32, (1.0 + 0.5 + 1.0 / 3.0) / 3.0];
            for out in results.values() {
                assert_eq!(out[step], results[&0][step], "members disagree at step {step}");
                assert!(
                    (out[step][0] - want[0]).abs() < 1e-6 && (out[step][1] - want[1]).abs() < 1e-6
                );
            }
        }
        assert_eq!(results[&0][3], vec![0.5, 0.0]);
        assert_eq!(results[&1][3], vec![0.5, 0.0]);
    }
}
