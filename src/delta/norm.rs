//! Outlier check on delta norms against the recent distribution (DESIGN.md §3.6).
//!
//! A delta whose norm is far above what honest peers have been sending is either a bug or
//! an attack; merging it would move the anchor by that much on every peer. The median of a
//! short window is robust to a few bad samples and needs no tuning beyond one factor.

use std::collections::VecDeque;

/// Rolling window of accepted delta norms for one fragment.
#[derive(Debug, Clone)]
pub struct NormGuard {
    /// Most recent accepted norms, oldest first.
    window: VecDeque<f32>,
    /// Window length; bounds memory and how fast the guard follows a changing scale.
    capacity: usize,
    /// Samples needed before the guard rejects anything (a cold guard accepts all).
    min_samples: usize,
    /// A norm above `factor × median` is rejected.
    factor: f32,
    /// Median of the window, refreshed every `capacity / 8` records: sorting the window
    /// for every delta cost more than decoding it in thousand-peer simulations.
    cached: Option<f32>,
    /// Records since the median was refreshed.
    stale: usize,
}

impl NormGuard {
    /// A guard with the given window length, warm-up and factor.
    pub fn new(capacity: usize, min_samples: usize, factor: f32) -> Self {
        Self {
            window: VecDeque::with_capacity(capacity),
            capacity,
            min_samples,
            factor,
            cached: None,
            stale: 0,
        }
    }

    /// Median of the window as last refreshed, if the guard is warm.
    pub fn median(&self) -> Option<f32> {
        self.cached
    }

    fn compute_median(&self) -> Option<f32> {
        if self.window.len() < self.min_samples.max(1) {
            return None;
        }
        let mut v: Vec<f32> = self.window.iter().copied().collect();
        v.sort_by(f32::total_cmp);
        Some(v[v.len() / 2])
    }

    /// `Err(limit)` when `norm` is an outlier; `Ok` otherwise. Does not record it.
    pub fn check(&self, norm: f32) -> Result<(), f32> {
        match self.median() {
            Some(m) if norm > self.factor * m => Err(self.factor * m),
            _ => Ok(()),
        }
    }

    /// Records an accepted norm.
    pub fn record(&mut self, norm: f32) {
        if self.window.len() == self.capacity {
            self.window.pop_front();
        }
        self.window.push_back(norm);
        self.stale += 1;
        if self.cached.is_none() || self.stale >= (self.capacity / 8).max(1) {
            self.cached = self.compute_median();
            self.stale = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cold_guard_accepts_then_rejects_outliers() {
        let mut g = NormGuard::new(8, 4, 10.0);
        assert!(g.check(1e9).is_ok());
        for n in [1.0, 2.0, 1.5, 1.2] {
            g.record(n);
        }
        assert!(g.check(14.0).is_ok());
        assert!(g.check(16.0).is_err());
        for _ in 0..20 {
            g.record(3.0);
        }
        assert_eq!(g.window.len(), 8);
        assert_eq!(g.median(), Some(3.0));
        assert!(g.check(31.0).is_err());
    }
}
