//! The simulated network: per-message latency, loss, partitions and per-peer upload
//! bandwidth (a payload served to many peers queues on the server's uplink).

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Network parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConfig {
    /// One-way latency, drawn uniformly per message, in ms.
    pub latency_ms: (u64, u64),
    /// Probability that a point-to-point message (fetch request or response) is lost.
    pub loss: f64,
    /// Independent mesh paths a gossip message travels (gossipsub forwards through several
    /// neighbours and repairs with IHAVE/IWANT), so it is lost with probability
    /// `loss^gossip_paths`.
    pub gossip_paths: i32,
    /// Upload bandwidth per peer in bytes per ms (1000 = 1 MB/s = 8 Mbit/s).
    pub upload_bytes_per_ms: f64,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self { latency_ms: (5, 50), loss: 0.0, gossip_paths: 3, upload_bytes_per_ms: 10_000.0 }
    }
}

/// Live network state.
#[derive(Debug, Clone)]
pub struct Net {
    pub cfg: NetConfig,
    /// Partition group of each peer; messages cross groups only when all are 0.
    group: Vec<u8>,
    /// Time each peer's uplink is busy until.
    uplink_free: Vec<f64>,
}

impl Net {
    pub fn new(cfg: NetConfig, peers: usize) -> Self {
        Self { cfg, group: vec![0; peers], uplink_free: vec![0.0; peers] }
    }

    /// Puts each peer in a partition group (`0` everywhere heals).
    pub fn set_groups(&mut self, groups: Vec<u8>) {
        self.group = groups;
    }

    pub fn heal(&mut self) {
        self.group.iter_mut().for_each(|g| *g = 0);
    }

    pub fn connected(&self, a: usize, b: usize) -> bool {
        self.group[a] == self.group[b]
    }

    /// Delivery time of a small point-to-point message sent at `now`, or `None` if lost.
    pub fn small(&self, rng: &mut ChaCha8Rng, a: usize, b: usize, now: u64) -> Option<u64> {
        self.deliver(rng, a, b, now, self.cfg.loss)
    }

    /// Delivery time of a gossip message sent at `now`, or `None` if lost.
    pub fn gossip(&self, rng: &mut ChaCha8Rng, a: usize, b: usize, now: u64) -> Option<u64> {
        self.deliver(rng, a, b, now, self.cfg.loss.powi(self.cfg.gossip_paths))
    }

    fn deliver(
        &self,
        rng: &mut ChaCha8Rng,
        a: usize,
        b: usize,
        now: u64,
        loss: f64,
    ) -> Option<u64> {
        if !self.connected(a, b) || (loss > 0.0 && rng.random_bool(loss.min(1.0))) {
            return None;
        }
        let (lo, hi) = self.cfg.latency_ms;
        Some(now + rng.random_range(lo..=hi.max(lo)))
    }

    /// Delivery time of `bytes` sent by `a` to `b` at `now`: queued behind what `a` is
    /// already uploading, then latency. `None` if lost.
    pub fn bulk(
        &mut self,
        rng: &mut ChaCha8Rng,
        a: usize,
        b: usize,
        now: u64,
        bytes: usize,
    ) -> Option<u64> {
        let arrive = self.small(rng, a, b, now)?;
        let start = self.uplink_free[a].max(now as f64);
        let done = start + bytes as f64 / self.cfg.upload_bytes_per_ms;
        self.uplink_free[a] = done;
        Some(arrive + (done - now as f64).ceil() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn uplink_queues_and_partitions_cut() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let cfg = NetConfig {
            latency_ms: (10, 10),
            loss: 0.0,
            gossip_paths: 3,
            upload_bytes_per_ms: 100.0,
        };
        let mut net = Net::new(cfg, 3);
        assert_eq!(net.bulk(&mut rng, 0, 1, 0, 1000), Some(20));
        assert_eq!(net.bulk(&mut rng, 0, 2, 0, 1000), Some(30));
        net.set_groups(vec![0, 1, 1]);
        assert_eq!(net.small(&mut rng, 0, 1, 0), None);
        assert!(net.small(&mut rng, 1, 2, 0).is_some());
        net.heal();
        assert!(net.small(&mut rng, 0, 1, 0).is_some());
    }
}
