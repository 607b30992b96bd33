//! The discrete-event queue: events ordered by time, ties by insertion order, so a run is
//! a pure function of its seed.
//!
//! Times are whole milliseconds and a large swarm puts thousands of events on the same
//! millisecond, so the queue is a map from time to a FIFO bucket rather than a binary
//! heap: a push is one map lookup and a pop touches only the front bucket. (A heap of a
//! million entries spent most of a thousand-peer run sifting.)

use std::collections::{BTreeMap, VecDeque};

/// Min-queue of timed events with FIFO tie-breaking.
pub struct Queue<E> {
    buckets: BTreeMap<u64, VecDeque<E>>,
    len: usize,
}

impl<E> Default for Queue<E> {
    fn default() -> Self {
        Self { buckets: BTreeMap::new(), len: 0 }
    }
}

impl<E> std::fmt::Debug for Queue<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Queue({} events)", self.len)
    }
}

impl<E> Queue<E> {
    pub fn push(&mut self, at: u64, event: E) {
        self.buckets.entry(at).or_default().push_back(event);
        self.len += 1;
    }

    /// The next event if it is due at or before `until`.
    pub fn pop_until(&mut self, until: u64) -> Option<(u64, E)> {
        let mut first = self.buckets.first_entry()?;
        let at = *first.key();
        if at > until {
            return None;
        }
        let event = first.get_mut().pop_front();
        if first.get().is_empty() {
            first.remove();
        }
        self.len -= usize::from(event.is_some());
        event.map(|e| (at, e))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_then_fifo() {
        let mut q = Queue::default();
        q.push(5, "b");
        q.push(1, "a");
        q.push(5, "c");
        q.push(9, "d");
        let got: Vec<_> = std::iter::from_fn(|| q.pop_until(5)).collect();
        assert_eq!(got, vec![(1, "a"), (5, "b"), (5, "c")]);
        assert_eq!(q.len(), 1);
        // An event pushed for the current time while it is being drained runs after
        // the ones already there.
        q.push(9, "e");
        assert_eq!(q.pop_until(9), Some((9, "d")));
        assert_eq!(q.pop_until(9), Some((9, "e")));
        assert!(q.is_empty());
    }
}
