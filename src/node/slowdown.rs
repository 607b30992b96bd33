//! An emulated slower machine: `atoll run --slowdown F` makes every inner step take `F`
//! times its compute time, the trainer thread idling for the rest; `--min-step-ms T`
//! makes every step take at least `T` (an emulated machine of its own: see below).
//!
//! Why idle rather than burn CPU: the point is a peer whose *step rate* is `F` times lower
//! (slower hardware), as the paper's heterogeneous-speed experiment has (DESIGN.md §2.4),
//! and several such peers must fit on one small machine; an idle thread leaves the cores
//! to the other peers, as a separate machine would. The pause comes after the step and
//! before the trainer looks at its commands again, so a slow peer answers snapshot
//! requests and takes anchors at its own step boundaries, one slow step late at worst —
//! what a slow machine does. Validation passes and checkpoints are not slowed.
//!
//! A floor `T` above the step's compute time fixes the step *rate* whatever the other
//! processes on the machine do: when a peer dies, its CPU does not speed the survivors
//! up, as it would not if each peer had a machine of its own. That is what a failure
//! experiment on one machine needs (`atoll chaos --min-step-ms`, `bench/p3.sh`).

use std::time::Duration;

/// Largest factor accepted: beyond it a "peer" is a stalled one (`kill -STOP` tests that).
pub const MAX_FACTOR: f64 = 1000.0;
/// Longest step floor accepted (10 minutes).
pub const MAX_FLOOR: Duration = Duration::from_secs(600);

/// A factor that is not a slowdown.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SlowdownError {
    #[error("slowdown {0:?} is not a number")]
    NotANumber(String),
    #[error("slowdown {0} must be a finite number from 1 (full speed) to {MAX_FACTOR}")]
    OutOfRange(f64),
    #[error("a step floor of {0:?} is longer than the {MAX_FLOOR:?} accepted")]
    FloorTooLong(Duration),
}

/// How much longer than its compute time each inner step takes: `factor` times (1: full
/// speed), and at least `floor` (zero: no floor).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slowdown {
    factor: f64,
    floor: Duration,
}

impl Slowdown {
    /// Full speed.
    pub const NONE: Slowdown = Slowdown { factor: 1.0, floor: Duration::ZERO };

    /// `factor` in `1..=MAX_FACTOR`; NaN and infinities are refused.
    pub fn new(factor: f64) -> Result<Self, SlowdownError> {
        if factor.is_finite() && (1.0..=MAX_FACTOR).contains(&factor) {
            Ok(Slowdown { factor, floor: Duration::ZERO })
        } else {
            Err(SlowdownError::OutOfRange(factor))
        }
    }

    /// The same factor, and every step lasting at least `floor` (up to [`MAX_FLOOR`]).
    pub fn with_floor(self, floor: Duration) -> Result<Self, SlowdownError> {
        if floor > MAX_FLOOR {
            return Err(SlowdownError::FloorTooLong(floor));
        }
        Ok(Slowdown { floor, ..self })
    }

    pub fn factor(self) -> f64 {
        self.factor
    }

    pub fn floor(self) -> Duration {
        self.floor
    }

    /// How long to idle after a step that computed for `compute`, so that compute + pause
    /// = `factor × compute`, and at least the floor. Zero at full speed.
    pub fn pause(self, compute: Duration) -> Duration {
        let lift = self.floor.saturating_sub(compute);
        if self.factor <= 1.0 {
            return lift;
        }
        // Both factors are bounded (a step of a day × 999 still fits a Duration), but a
        // clock that jumped must not panic the trainer: saturate instead.
        let stretch = Duration::try_from_secs_f64(compute.as_secs_f64() * (self.factor - 1.0))
            .unwrap_or(Duration::MAX);
        stretch.max(lift)
    }

    /// Idles this thread for [`Slowdown::pause`] of a step that started computing at
    /// `computing` (returns at once at full speed).
    pub fn idle_after(self, computing: std::time::Instant) {
        let pause = self.pause(computing.elapsed());
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
}

impl Default for Slowdown {
    fn default() -> Self {
        Slowdown::NONE
    }
}

impl std::fmt::Display for Slowdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.factor)?;
        if !self.floor.is_zero() {
            write!(f, " (steps of at least {} ms)", self.floor.as_millis())?;
        }
        Ok(())
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
    fn a_floor_lifts_short_steps_and_leaves_long_ones() {
        let floor = Duration::from_millis(500);
        let paced = Slowdown::NONE.with_floor(floor).unwrap();
        assert_eq!(paced.pause(Duration::from_millis(120)), Duration::from_millis(380));
        assert_eq!(paced.pause(Duration::from_millis(700)), Duration::ZERO);
        assert_eq!(paced.pause(Duration::MAX), Duration::ZERO);
        // With a factor, the longer of the two pauses.
        let both = Slowdown::new(2.0).unwrap().with_floor(floor).unwrap();
        assert_eq!(both.pause(Duration::from_millis(100)), Duration::from_millis(400));
        assert_eq!(both.pause(Duration::from_millis(300)), Duration::from_millis(300));
        assert_eq!(both.factor(), 2.0);
        assert_ne!(paced, Slowdown::NONE);
        assert_eq!(paced.to_string(), "1 (steps of at least 500 ms)");
        let e = Slowdown::NONE.with_floor(MAX_FLOOR + Duration::from_millis(1)).unwrap_err();
        assert!(e.to_string().contains("longer than"), "{e}");
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
