//! Inner learning-rate schedule: linear warm-up, then cosine decay to a floor.

use serde::{Deserialize, Serialize};

/// Linear warm-up for `warmup` steps to `peak`, then cosine decay to `peak * floor` at
/// `decay_steps`, flat afterwards (a peer that trains past the plan keeps learning).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LrSchedule {
    pub peak: f64,
    pub warmup: u64,
    pub decay_steps: u64,
    pub floor: f64,
}

impl Default for LrSchedule {
    /// Peak 8e-3: the best inner rate of the quality sweep for the swarm and for
    /// data-parallel alike (bench/RESULTS.md, "Inner learning rate").
    fn default() -> Self {
        Self { peak: 8e-3, warmup: 20, decay_steps: 1000, floor: 0.1 }
    }
}

impl LrSchedule {
    /// Learning rate for inner step `step` (0-based).
    pub fn at(&self, step: u64) -> f64 {
        if step < self.warmup {
            return self.peak * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self.decay_steps.saturating_sub(self.warmup).max(1);
        let progress = ((step - self.warmup) as f64 / span as f64).min(1.0);
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.peak * (self.floor + (1.0 - self.floor) * cosine)
    }

    pub fn validate(&self) -> Result<(), String> {
        if !(self.peak > 0.0 && self.peak < 1.0) {
            return Err(format!("learning rate {} must lie in (0, 1)", self.peak));
        }
        if !(0.0..=1.0).contains(&self.floor) {
            return Err(format!("lr floor {} must lie in [0, 1]", self.floor));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_then_decays_to_the_floor() {
        let s = LrSchedule { peak: 1e-3, warmup: 10, decay_steps: 110, floor: 0.1 };
        assert!((s.at(0) - 1e-4).abs() < 1e-12);
        assert!((s.at(9) - 1e-3).abs() < 1e-12);
        assert!((s.at(10) - 1e-3).abs() < 1e-12);
        assert!((s.at(60) - 0.55e-3).abs() < 1e-9);
        assert!((s.at(110) - 1e-4).abs() < 1e-12);
        assert!((s.at(10_000) - 1e-4).abs() < 1e-12);
        assert!((1..200).all(|t| t < 10 || s.at(t) <= s.at(t - 1)));
    }
}
