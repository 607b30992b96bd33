//! The reduce of a group step: every other member's buffer fetched (all at once, with the
//! retries a strict or an elastic group allows) and the mean taken in member order, in f64,
//! so every member computes the same bits.

use std::collections::BTreeMap;
use std::time::Duration;

use atoll_net::PeerId;
use tokio::time::Instant;

use super::{CollectiveError, Group};
use crate::node::Network;

/// Pause between a strict group's fetch tries of one buffer.
const STRICT_RETRY: Duration = Duration::from_millis(500);

impl<N: Network> Group<N> {
    /// Fetches the other members' buffers (all at once) and averages in member order.
    pub(super) async fn reduce(
        &mut self,
        step: u64,
        mine: &[f32],
    ) -> Result<Vec<f32>, CollectiveError> {
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
            // The author first; any member that fetched it serves it too (atoll-net asks
            // the run's peers), so a buffer outlives an author killed after announcing it.
            // Elastic: a second try (a fetch that ran while this process was stopped fails
            // on its own timers, and the buffer may be held by a member that fetched it
            // meanwhile), then the member is dropped. Strict: tries until the barrier
            // timeout, as the group fails without the buffer; a lone holder behind a tight
            // upload cap answers busy or late, and that must not end the run.
            let (elastic, until) = (self.elastic, Instant::now() + self.timeout);
            fetches.spawn(async move {
                let mut got = net.fetch(hash, vec![peer], len).await;
                let mut tries = 1;
                while got.is_err() && if elastic { tries < 2 } else { Instant::now() < until } {
                    if !elastic {
                        tokio::time::sleep(STRICT_RETRY).await;
                    }
                    got = net.fetch(hash, vec![peer], len).await;
                    tries += 1;
                }
                (peer, hash, len, got)
            });
        }
        let mut buffers: BTreeMap<PeerId, Vec<f32>> = BTreeMap::new();
        let mut averaged = Vec::new();
        while let Some(done) = fetches.join_next().await {
            let Ok((peer, hash, len, got)) = done else { return Err(CollectiveError::Closed) };
            let fail = |reason: String| CollectiveError::Fetch { step, peer, reason };
            let bytes = match got {
                Ok(b) => b,
                Err(e) if self.elastic => {
                    // Nobody could deliver it: its author is gone. Every member that fails
                    // the same way leaves it out; one that got it in time keeps it (the
                    // members then differ by that one buffer; see ARCHITECTURE.md).
                    tracing::warn!(step, %peer, error = %e, "buffer unavailable; going on without its member");
                    self.members.retain(|p| *p != peer);
                    continue;
                }
                Err(e) => return Err(fail(e.to_string())),
            };
            if bytes.len() as u64 != len {
                return Err(fail(format!("{} bytes, expected {len}", bytes.len())));
            }
            averaged.push((peer, hash));
            let values = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            buffers.insert(peer, values);
        }
        buffers.insert(self.me, mine.to_vec());
        if let Some(&(hash, _)) = self.heard.get(&(step, self.me)) {
            averaged.push((self.me, hash));
        }
        averaged.sort();
        self.averaged = averaged;
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
