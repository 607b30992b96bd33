//! The node's fetch tasks: exactly one per hash in flight.
//!
//! The protocol core asks for a payload once ([`crate::proto::Output::Fetch`], with the
//! holders and a deadline) and atoll-net owns sources, hedging and retries; the node only
//! runs that one transfer as a task, stops it at [`crate::proto::Output::CancelFetch`] or
//! when the deadline passes, and hands back exactly one answer. Should the core ever ask
//! again for a hash still in flight, the earlier task is stopped first: two transfers of
//! the same bytes never run side by side.

use std::collections::HashMap;
use std::future::Future;

use tokio::task::{AbortHandle, Id, JoinSet};

use crate::delta::ContentHash;
use crate::proto::Event;

/// Running fetch tasks, by hash.
#[derive(Default)]
pub(crate) struct Fetches {
    tasks: JoinSet<Event>,
    by_hash: HashMap<ContentHash, AbortHandle>,
    by_id: HashMap<Id, ContentHash>,
}

impl Fetches {
    /// Runs `fetch` as the one task for `hash` (stopping an earlier one).
    pub fn start(
        &mut self,
        hash: ContentHash,
        fetch: impl Future<Output = Event> + Send + 'static,
    ) {
        self.cancel(&hash);
        let handle = self.tasks.spawn(fetch);
        self.by_id.insert(handle.id(), hash);
        self.by_hash.insert(hash, handle);
    }

    /// Stops the task for `hash`, if any; it will not answer.
    pub fn cancel(&mut self, hash: &ContentHash) {
        if let Some(h) = self.by_hash.remove(hash) {
            h.abort();
        }
    }

    /// Tasks running for `hash` (0 or 1).
    #[cfg(test)]
    pub fn running(&self, hash: &ContentHash) -> usize {
        usize::from(self.by_hash.contains_key(hash))
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The next answer of a task that was not cancelled (`None` when no task is left).
    pub async fn next(&mut self) -> Option<Event> {
        while let Some(done) = self.tasks.join_next_with_id().await {
            let (id, answer) = match done {
                Ok((id, event)) => (id, Some(event)),
                Err(e) => (e.id(), None),
            };
            let Some(hash) = self.by_id.remove(&id) else { continue };
            // Only the current task of its hash answers (an earlier one may have finished
            // just as it was replaced).
            if self.by_hash.get(&hash).is_some_and(|h| h.id() == id) {
                self.by_hash.remove(&hash);
                if answer.is_some() {
                    return answer;
                }
            }
        }
        None
    }

    /// Stops every task (shutdown).
    pub fn shutdown(&mut self) {
        self.tasks.abort_all();
        self.by_hash.clear();
        self.by_id.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::PeerId;
    use std::time::Duration;

    fn failed(hash: ContentHash) -> Event {
        Event::FetchFailed { from: PeerId(1), hash, denied: Vec::new(), silent: Vec::new() }
    }

    #[tokio::test]
    async fn one_task_per_hash_and_cancelled_ones_never_answer() {
        let (a, b) = (ContentHash([1; 32]), ContentHash([2; 32]));
        let mut f = Fetches::default();
        let slow = |h| async move {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            failed(h)
        };
        f.start(a, slow(a));
        f.start(a, async move { failed(a) });
        assert_eq!(f.running(&a), 1, "a second fetch of one hash ran beside the first");
        f.start(b, slow(b));
        f.cancel(&b);
        assert_eq!(f.running(&b), 0);
        // Only the replacement of `a` answers; the first `a` and `b` were stopped.
        let got = tokio::time::timeout(Duration::from_secs(5), f.next()).await.unwrap();
        assert!(matches!(got, Some(Event::FetchFailed { hash, .. }) if hash == a));
        assert_eq!(f.running(&a), 0);
        let rest = tokio::time::timeout(Duration::from_secs(5), f.next()).await.unwrap();
        assert!(rest.is_none(), "a cancelled fetch answered");
        assert!(f.is_empty());
    }
}
