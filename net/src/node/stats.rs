//! The [`NetStats`] snapshot of the swarm task.

use std::time::Instant;

use libp2p::multiaddr::Protocol;

use super::event_loop::EventLoop;
use crate::counters::{NetStats, RejectReason};

impl EventLoop {
    pub(super) fn stats(&mut self) -> NetStats {
        let peer_id = *self.swarm.local_peer_id();
        let listen_addrs = self
            .swarm
            .listeners()
            .map(|a| a.clone().with(Protocol::P2p(peer_id)).to_string())
            .collect();
        let transport = self.counters.transport.get();
        let mut protocols = std::collections::BTreeMap::new();
        protocols.insert("transport".to_string(), transport);
        protocols.insert("blob".to_string(), self.counters.blob.get());
        protocols.insert("announce".to_string(), self.counters.announce.get());
        for kind in crate::streamkind::StreamKind::ALL {
            let count = self.counters.streams[kind.index()].get();
            if count != crate::counters::ByteCount::default() {
                protocols.insert(format!("stream/{}", kind.as_str()), count);
            }
        }
        let (blobs_stored, store_bytes) = {
            let s = self.store.lock().unwrap_or_else(|p| p.into_inner());
            (s.len(), s.used_bytes())
        };
        let (struck, recent_bans) = self.hygiene.suspects(self.started, Instant::now());
        NetStats {
            peer_id: peer_id.to_string(),
            run_name: self.run_name.clone(),
            listen_addrs,
            run_peers: self.run_peers().iter().map(|p| p.to_string()).collect(),
            connected: self.swarm.network_info().num_peers(),
            routing_table_size: self.routing_table_size(),
            bytes_sent: transport.sent,
            bytes_received: transport.received,
            protocols,
            peers: self.peers.bytes.iter().map(|(p, b)| (p.to_string(), *b)).collect(),
            rejects: self.rejects(),
            events_dropped: self.events_dropped,
            blobs_stored,
            store_bytes,
            penalised: self.peers.penalised_count(Instant::now()),
            uptime_secs: self.started.elapsed().as_secs(),
            banned: self.hygiene.banned.len(),
            strikes: self.hygiene.strike_counts.iter().map(|(r, n)| (r.to_string(), *n)).collect(),
            struck,
            recent_bans,
            log_suppressed: self.peers.log_suppressed() + self.uploads.log_suppressed(),
            provider_dials: self.provider_dials,
            upload_refusals: self
                .uploads
                .share
                .refusals()
                .map(|(p, n)| (p.to_string(), n))
                .collect(),
            // Fetches run in the callers' tasks: `NetClient::stats` fills these in.
            hedged_requests: 0,
            slow_sources: 0,
            reachability: self.nat.reachability,
            links: self.nat_links(),
            relay: self.nat_relay_stats(),
            bootstrap: self.bootstrap.iter().map(|a| a.to_string()).collect(),
            max_upload_bytes_per_sec: self.uploads.cap(),
            dial_failures: self.dial_failures.snapshot(),
        }
    }

    fn rejects(&self) -> std::collections::BTreeMap<String, u64> {
        let mut out: std::collections::BTreeMap<String, u64> =
            self.peers.rejects.iter().map(|(r, n)| (r.as_str().to_string(), *n)).collect();
        let garbage = self.counters.blob_malformed.load(std::sync::atomic::Ordering::Relaxed);
        if garbage > 0 {
            *out.entry(RejectReason::BlobMalformed.as_str().to_string()).or_default() += garbage;
        }
        out
    }
}
