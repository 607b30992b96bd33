//! An emulated slower machine: `atoll run --slowdown F` makes every inner step take `F`
//! times its compute time, the trainer thread idling for the rest.
//!
//! Why idle rather than burn CPU: the point is a peer whose *step rate* is `F` times lower
//! (slower hardware), as the paper's heterogeneous-speed experiment has (DESIGN.md §2.4),
//! and several such peers must fit on one small machine; an idle thread leaves the cores
//! to the other peers, as a separate machine would. The pause comes after the step and
//! before the trainer looks at its commands again, so a slow peer answers snapshot
//! requests and takes anchors at its own step boundaries, one slow step late at worst —
//! what a slow machine does. Validation passes and checkpoints are not slowed.

use std::time::Duration;

/// Largest factor accepted: beyond it a "peer" is a stalled one (`kill -STOP` tests that).
pub const MAX_FACTOR: f64 = 1000.0;

/// A factor that is not a slowdown.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SlowdownError {
    #[error("slowdown {0:?} is not a number")]
    NotANumber(String),
    #[error("slowdown {0} must be a finite number from 1 (full speed) to {MAX_FACTOR}")]
    OutOfRange(f64),
}

/// How many times longer than its compute time each inner step takes (1: full speed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slowdown(f64);

impl Slowdown {
    /// Full speed.
    pub const NONE: Slowdown = Slowdown(1.0);

    /// `factor` in `1..=MAX_FACTOR`; NaN and infinities are refused.
    pub fn new(factor: f64) -> Result<Self, SlowdownError> {
        if factor.is_finite() && (1.0..=MAX_FACTOR).contains(&factor) {
            Ok(Slowdown(factor))
        } else {
            Err(SlowdownError::OutOfRange(factor))
        }
    }

    pub fn factor(self) -> f64 {
        self.0
    }

    /// How long to idle after a step that computed for `compute`, so that compute + pause
    /// = `factor × compute`. Zero at full speed.
    pub fn pause(self, compute: Duration) -> Duration {
        if self.0 <= 1.0 {
            return Duration::ZERO;
        }
        // Both factors are bounded (a step of a day × 999 still fits a Duration), but a
        // clock that jumped must not panic the trainer: saturate instead.
        Duration::try_from_secs_f64(compute.as_secs_f64() * (self.0 - 1.0)).unwrap_or(Duration::MAX)
    }
}

impl Default for Slowdown {
    fn default() -> Self {
        Slowdown::NONE
    }
}

impl std::fmt::Display for Slowdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::str::FromStr for Slowdown {
    type Err = SlowdownError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let factor: f64 = s.trim().parse().map_err(|_| SlowdownError::NotANumber(s.to_owned()))?;
        Slowdown::new(factor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_takes_factor_times_its_compute_time() {
        let compute = Duration::from_millis(120);
        for (f, pause_ms) in [(1.0, 0), (1.5, 60), (4.0, 360), (10.0, 1080)] {
            let s = Slowdown::new(f).unwrap();
            assert_eq!(s.pause(compute), Duration::from_millis(pause_ms), "factor {f}");
            let total = compute + s.pause(compute);
            assert!((total.as_secs_f64() / compute.as_secs_f64() - f).abs() < 1e-9);
        }
        assert_eq!(Slowdown::NONE.pause(Duration::from_secs(5)), Duration::ZERO);
        assert_eq!(Slowdown::new(4.0).unwrap().pause(Duration::ZERO), Duration::ZERO);
        // The largest factor on a long step neither panics nor wraps.
        let max = Slowdown::new(MAX_FACTOR).unwrap();
        assert_eq!(max.pause(Duration::from_secs(3600)), Duration::from_secs(3600 * 999));
        assert_eq!(max.pause(Duration::MAX), Duration::MAX);
    }

    #[test]
    fn factors_below_one_or_not_finite_are_refused_with_the_reason() {
        for bad in [0.0, 0.5, -4.0, f64::NAN, f64::INFINITY, MAX_FACTOR + 1.0] {
            let e = Slowdown::new(bad).unwrap_err().to_string();
            assert!(e.contains("from 1 (full speed)"), "{bad}: {e}");
        }
        for bad in ["", "four", "4x", "NaN", "inf", "0.99", "-1"] {
            assert!(bad.parse::<Slowdown>().is_err(), "{bad:?} accepted");
        }
        assert_eq!("4".parse::<Slowdown>().unwrap().factor(), 4.0);
        assert_eq!(" 1 ".parse::<Slowdown>().unwrap(), Slowdown::NONE);
        let e = "four".parse::<Slowdown>().unwrap_err().to_string();
        assert!(e.contains("\"four\" is not a number"), "{e}");
    }
}
