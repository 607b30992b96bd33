//! An in-process network: several nodes in one process exchange announcements and
//! payloads through shared memory instead of libp2p, so tests drive the real node code
//! (event loop, effects, fetch tasks, trainer thread, disk) through restarts, late joins
//! and partitions without starting processes.
//!
//! Every member of a [`MemSwarm`] sits on an *island*; gossip and fetches reach only the
//! members of the same island. [`MemSwarm::split`] cuts the swarm into islands and
//! [`MemSwarm::heal`] joins them again, telling each side about the other's peers as
//! atoll-net does when connections come back. A fetch is answered at once from the first
//! holder (the caller's sources first, then anyone on its island) or fails at once:
//! delivery order and timing are the tokio scheduler's, not a simulated link's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use atoll_net::{BlobHash, FetchError, NetError, NetEvent, NetStats, PeerId, RejectReason};
use bytes::Bytes;
use tokio::sync::mpsc;

use super::network::Network;

/// Events a member may have queued before newer ones are dropped (as atoll-net does when
/// its consumer falls behind).
const EVENT_QUEUE: usize = 4096;

/// The shared medium of an in-process swarm.
#[derive(Clone, Default)]
pub struct MemSwarm {
    hub: Arc<Mutex<Hub>>,
}

#[derive(Default)]
struct Hub {
    members: HashMap<PeerId, Member>,
}

struct Member {
    events: mpsc::Sender<NetEvent>,
    blobs: HashMap<BlobHash, Bytes>,
    island: u32,
    /// Reports received about this member: (reporter, reason).
    reports: Vec<(PeerId, String)>,
}

/// One member's handle on a [`MemSwarm`].
#[derive(Clone)]
pub struct MemNet {
    me: PeerId,
    hub: Arc<Mutex<Hub>>,
}

impl MemSwarm {
    pub fn new() -> MemSwarm {
        MemSwarm::default()
    }

    fn lock(&self) -> MutexGuard<'_, Hub> {
        self.hub.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `peer` joins island 0 (or comes back after [`MemSwarm::leave`], with an empty
    /// store, as a restarted process does); it and the members there learn of each other.
    pub fn join(&self, peer: PeerId) -> (MemNet, mpsc::Receiver<NetEvent>) {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let mut hub = self.lock();
        let member = Member { events: tx, blobs: HashMap::new(), island: 0, reports: Vec::new() };
        hub.members.insert(peer, member);
        let others: Vec<PeerId> = hub
            .members
            .iter()
            .filter(|(p, m)| **p != peer && m.island == 0)
            .map(|(p, _)| *p)
            .collect();
        for other in others {
            hub.tell(other, NetEvent::RunPeerJoined(peer));
            hub.tell(peer, NetEvent::RunPeerJoined(other));
        }
        drop(hub);
        (MemNet { me: peer, hub: self.hub.clone() }, rx)
    }

    /// `peer` leaves (its process ended); the others on its island are told.
    pub fn leave(&self, peer: PeerId) {
        let mut hub = self.lock();
        let Some(gone) = hub.members.remove(&peer) else { return };
        let others: Vec<PeerId> =
            hub.members.iter().filter(|(_, m)| m.island == gone.island).map(|(p, _)| *p).collect();
        for other in others {
            hub.tell(other, NetEvent::RunPeerLeft(peer));
        }
    }

    /// Cuts the swarm: the members of `islands[i]` are on island `i + 1`; the others stay
    /// on island 0. Peers on different islands stop hearing each other.
    pub fn split(&self, islands: &[&[PeerId]]) {
        let mut hub = self.lock();
        let before: HashMap<PeerId, u32> =
            hub.members.iter().map(|(p, m)| (*p, m.island)).collect();
        for (i, island) in islands.iter().enumerate() {
            for p in *island {
                if let Some(m) = hub.members.get_mut(p) {
                    m.island = i as u32 + 1;
                }
            }
        }
        hub.announce_moves(&before);
    }

    /// Joins every island again; peers that were apart learn of each other.
    pub fn heal(&self) {
        let mut hub = self.lock();
        let before: HashMap<PeerId, u32> =
            hub.members.iter().map(|(p, m)| (*p, m.island)).collect();
        for m in hub.members.values_mut() {
            m.island = 0;
        }
        hub.announce_moves(&before);
    }

    /// Reasons `peer` was penalised or reported for, by anyone.
    pub fn reports_about(&self, peer: PeerId) -> Vec<String> {
        self.lock()
            .members
            .get(&peer)
            .map(|m| m.reports.iter().map(|r| r.1.clone()).collect())
            .unwrap_or_default()
    }
}

impl Hub {
    fn tell(&self, peer: PeerId, event: NetEvent) {
        if let Some(m) = self.members.get(&peer) {
            // A full queue drops the event, as atoll-net's does.
            let _ = m.events.try_send(event);
        }
    }

    /// Tells every pair whose reachability changed since `before` (island by peer).
    fn announce_moves(&self, before: &HashMap<PeerId, u32>) {
        let peers: Vec<(PeerId, u32)> = self.members.iter().map(|(p, m)| (*p, m.island)).collect();
        for (i, &(a, island_a)) in peers.iter().enumerate() {
            for &(b, island_b) in &peers[i + 1..] {
                let was = before.get(&a) == before.get(&b);
                let is = island_a == island_b;
                if was == is {
                    continue;
                }
                let (to_a, to_b) = if is {
                    (NetEvent::RunPeerJoined(b), NetEvent::RunPeerJoined(a))
                } else {
                    (NetEvent::RunPeerLeft(b), NetEvent::RunPeerLeft(a))
                };
                self.tell(a, to_a);
                self.tell(b, to_b);
            }
        }
    }

    fn island(&self, peer: &PeerId) -> Option<u32> {
        self.members.get(peer).map(|m| m.island)
    }
}

impl MemNet {
    fn lock(&self) -> MutexGuard<'_, Hub> {
        self.hub.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn note(&self, peer: PeerId, reason: String) {
        if let Some(m) = self.lock().members.get_mut(&peer) {
            m.reports.push((self.me, reason));
        }
    }
}

impl Network for MemNet {
    fn peer_id(&self) -> PeerId {
        self.me
    }

    fn put_blob(&self, data: Bytes) -> Result<(), NetError> {
        let hash = BlobHash::of(&data);
        let mut hub = self.lock();
        let me = hub.members.get_mut(&self.me).ok_or(NetError::Shutdown)?;
        me.blobs.insert(hash, data);
        Ok(())
    }

    fn has_blob(&self, hash: &BlobHash) -> bool {
        self.lock().members.get(&self.me).is_some_and(|m| m.blobs.contains_key(hash))
    }

    async fn publish(&self, payload: Vec<u8>) -> Result<(), NetError> {
        let hub = self.lock();
        let island = hub.island(&self.me).ok_or(NetError::Shutdown)?;
        let payload = Bytes::from(payload);
        for (p, m) in &hub.members {
            if *p != self.me && m.island == island {
                let ev = NetEvent::Announcement {
                    from: self.me,
                    author: Some(self.me),
                    payload: payload.clone(),
                };
                let _ = m.events.try_send(ev);
            }
        }
        Ok(())
    }

    async fn publish_heartbeat(&self, payload: Vec<u8>) -> Result<(), NetError> {
        let hub = self.lock();
        let island = hub.island(&self.me).ok_or(NetError::Shutdown)?;
        let payload = Bytes::from(payload);
        for (p, m) in &hub.members {
            if *p != self.me && m.island == island {
                let ev = NetEvent::Heartbeat { author: self.me, payload: payload.clone() };
                let _ = m.events.try_send(ev);
            }
        }
        Ok(())
    }

    async fn fetch(
        &self,
        hash: BlobHash,
        sources: Vec<PeerId>,
        max_len: u64,
    ) -> Result<Bytes, NetError> {
        let mut hub = self.lock();
        let island = hub.island(&self.me).ok_or(NetError::Shutdown)?;
        let found = {
            let mine = hub.members.get(&self.me).and_then(|m| m.blobs.get(&hash));
            let reachable = |p: &PeerId| hub.members.get(p).filter(|m| m.island == island);
            let theirs = sources
                .iter()
                .filter_map(reachable)
                .chain(hub.members.values().filter(|m| m.island == island))
                .find_map(|m| m.blobs.get(&hash));
            mine.or(theirs).cloned()
        };
        let Some(data) = found else {
            // A reachable source without the blob answers that it does not hold it.
            let denied = sources
                .iter()
                .filter(|p| hub.members.get(p).is_some_and(|m| m.island == island))
                .copied()
                .collect();
            return Err(FetchError::NoChunkList { hash, denied, silent: Vec::new() }.into());
        };
        if data.len() as u64 > max_len {
            let size = data.len() as u64;
            return Err(FetchError::TooLarge { hash, size, limit: max_len }.into());
        }
        if let Some(me) = hub.members.get_mut(&self.me) {
            me.blobs.insert(hash, data.clone());
        }
        Ok(data)
    }

    async fn penalize(&self, peer: PeerId, reason: &'static str) {
        self.note(peer, reason.to_owned());
    }

    async fn report(&self, peer: PeerId, reason: RejectReason) {
        self.note(peer, format!("{reason:?}"));
    }

    async fn stats(&self) -> Result<NetStats, NetError> {
        let hub = self.lock();
        let island = hub.island(&self.me).ok_or(NetError::Shutdown)?;
        let mut run_peers: Vec<String> = hub
            .members
            .iter()
            .filter(|(p, m)| **p != self.me && m.island == island)
            .map(|(p, _)| p.to_string())
            .collect();
        run_peers.sort();
        Ok(NetStats {
            peer_id: self.me.to_string(),
            connected: run_peers.len(),
            run_peers,
            ..NetStats::default()
        })
    }
}
