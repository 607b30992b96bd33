//! The discrete-event queue: events ordered by time, ties by insertion order, so a run is
//! a pure function of its seed.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

struct Entry<E> {
    at: u64,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap and we want the earliest first.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Min-queue of timed events with FIFO tie-breaking.
pub struct Queue<E> {
    heap: BinaryHeap<Entry<E>>,
    seq: u64,
}

impl<E> Default for Queue<E> {
    fn default() -> Self {
        Self { heap: BinaryHeap::new(), seq: 0 }
    }
}

impl<E> std::fmt::Debug for Queue<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Queue({} events)", self.heap.len())
    }
}

impl<E> Queue<E> {
    pub fn push(&mut self, at: u64, event: E) {
        self.seq += 1;
        self.heap.push(Entry { at, seq: self.seq, event });
    }

    /// The next event if it is due at or before `until`.
    pub fn pop_until(&mut self, until: u64) -> Option<(u64, E)> {
        if self.heap.peek()?.at > until {
            return None;
        }
        self.heap.pop().map(|e| (e.at, e.event))
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
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
    }
}
