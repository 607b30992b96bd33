//! Where a node reads the time, and where its trainer runs.
//!
//! A real peer reads the system clock (peers on different machines share the run's round
//! schedule through it) and trains on a thread of its own. A test may instead run nodes on
//! the clock of the tokio runtime they are polled on: on a runtime started paused, that
//! clock is virtual (it jumps to the next timer whenever every task waits), so a scenario
//! of many seconds of rounds takes only the CPU time of its steps. For that the trainer
//! must run on the same runtime, as a task: a thread's compute would be invisible to the
//! paused clock, which would jump ahead while a step is being taken.

use crate::rundir::status;

/// A node's source of time; see the module docs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Clock {
    /// The system clock; the trainer on a thread of its own (every real peer).
    #[default]
    System,
    /// The tokio runtime's clock, counted from `origin` (read as `origin_unix_ms`); the
    /// trainer a task of that runtime. Virtual when the runtime's time is paused.
    Runtime { origin: tokio::time::Instant, origin_unix_ms: u64 },
}

impl Clock {
    /// The clock of the runtime this is called on (the one its nodes will run on),
    /// starting at the system's time now. Every node of one test must share one such
    /// clock: two made at different moments of a paused runtime disagree.
    pub fn runtime() -> Clock {
        Clock::Runtime { origin: tokio::time::Instant::now(), origin_unix_ms: status::unix_ms() }
    }

    /// Milliseconds since the Unix epoch by this clock.
    pub fn unix_ms(&self) -> u64 {
        match self {
            Clock::System => status::unix_ms(),
            Clock::Runtime { origin, origin_unix_ms } => {
                let since = tokio::time::Instant::now().saturating_duration_since(*origin);
                origin_unix_ms.saturating_add(since.as_millis() as u64)
            }
        }
    }

    /// True when the trainer runs as a task of the node's runtime.
    pub fn trains_on_runtime(&self) -> bool {
        matches!(self, Clock::Runtime { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_runtime_clock_follows_a_paused_runtime_and_the_system_clock_does_not() {
        let mut rt = tokio::runtime::Builder::new_current_thread();
        rt.enable_time().start_paused(true).build().unwrap().block_on(async {
            let clock = Clock::runtime();
            let (t0, wall0) = (clock.unix_ms(), Clock::System.unix_ms());
            tokio::time::sleep(Duration::from_secs(3600)).await;
            assert_eq!(clock.unix_ms() - t0, 3_600_000, "an hour on the paused clock");
            assert!(Clock::System.unix_ms() - wall0 < 60_000, "the system clock did not jump");
            assert!(clock.trains_on_runtime() && !Clock::System.trains_on_runtime());
        });
    }
}
