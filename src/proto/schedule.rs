//! The shared round schedule, the adaptive grace window and the merge window (DESIGN.md §2.2,
//! §2.3 Eq. 3).
//!
//! The schedule is a pure function of the settings and the time on the run's shared
//! timeline: round `r ≥ 1` of fragment `p` opens at `r·T + p·T/P` ms, with `T = H·step_ms`.
//! Round 0 is the initial anchor. Wall time, not each peer's own step count, drives the
//! clock: peers run at different speeds, and a step-based clock would let a fast peer close
//! round `r` before a slow one had even produced its delta for it, so the two would never
//! see the same set. With a time-based clock everyone publishes fragment `p` of round `r`
//! at about the same instant, whatever its speed; speed shows up in the token weights
//! instead. The cost is that peers need clocks agreeing to well under the grace window
//! (NTP gives milliseconds), and that the node must map its clock onto the run timeline.

use super::Settings;

/// Milliseconds on the run's shared timeline (0 = the run's epoch).
pub type Millis = u64;

/// Open times of every fragment's rounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    period: Millis,
    offsets: Vec<Millis>,
}

impl Schedule {
    /// The schedule of a run.
    pub fn new(settings: &Settings) -> Self {
        let period = settings.period_ms();
        let p = settings.raw().fragments as u64;
        Self { period, offsets: (0..p).map(|i| i * period / p).collect() }
    }

    /// Cycle period `T`.
    pub fn period(&self) -> Millis {
        self.period
    }

    /// When round `round` of `fragment` opens.
    pub fn open_time(&self, fragment: usize, round: u64) -> Millis {
        round.saturating_mul(self.period).saturating_add(self.offsets[fragment])
    }

    /// The latest round of `fragment` open at `now` (0 before round 1 opens).
    pub fn current_round(&self, fragment: usize, now: Millis) -> u64 {
        now.saturating_sub(self.offsets[fragment]) / self.period
    }

    /// The first round of `fragment` that opens strictly after `now`... or at `now`.
    pub fn next_round(&self, fragment: usize, now: Millis) -> u64 {
        let r = self.current_round(fragment, now).max(1);
        if self.open_time(fragment, r) >= now {
            r
        } else {
            r + 1
        }
    }
}

/// Exponential moving average with a prior.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ema {
    value: f64,
    weight: f64,
}

impl Ema {
    pub fn new(prior: f64, weight: f64) -> Self {
        Self { value: prior, weight }
    }

    pub fn update(&mut self, sample: f64) {
        self.value += self.weight * (sample - self.value);
    }

    pub fn get(&self) -> f64 {
        self.value
    }
}

/// Eq. 3: `grace = clamp(γ·(τ·t_step − t_quorum − t_sync), 0, cap)`, with each time a
/// moving average. The window only spends slack that the overlap of `τ` steps hides, so
/// the trainer is never blocked; a slow network shrinks it to zero.
#[derive(Debug, Clone, PartialEq)]
pub struct Grace {
    /// Local inner-step time (prior: the reference `step_ms`).
    pub t_step: Ema,
    /// Time from a round opening until the quorum is held (prior 0).
    pub t_quorum: Ema,
    /// Time from hearing an announcement until its payload is verified (prior 0).
    pub t_sync: Ema,
    gamma: f64,
    tau: f64,
    cap: f64,
}

impl Grace {
    pub fn new(settings: &Settings) -> Self {
        let r = settings.raw();
        let w = r.ema_weight;
        Self {
            t_step: Ema::new(r.step_ms as f64, w),
            t_quorum: Ema::new(0.0, w),
            t_sync: Ema::new(0.0, w),
            gamma: r.gamma,
            tau: r.tau as f64,
            cap: r.grace_cap_ms as f64,
        }
    }

    /// The window of a round whose set is not yet wide (`OpenRound::wide_at`): the whole
    /// cap, unless grace is off (γ 0).
    pub fn whole(&self) -> Millis {
        if self.gamma > 0.0 {
            self.cap as Millis
        } else {
            0
        }
    }

    /// The current window in ms.
    pub fn window(&self) -> Millis {
        let slack = self.tau * self.t_step.get() - self.t_quorum.get() - self.t_sync.get();
        (self.gamma * slack).clamp(0.0, self.cap) as Millis
    }
}

/// Which contributions a round merges: those made for rounds `round − lag − lateness ..=
/// round − lag`. With `lag = 1` a round merges the previous round's deltas, which have had a
/// whole period to reach every peer, so peers merge the same set without waiting; with
/// `lag = 0` a round merges its own deltas (fresher, but a set that depends on arrival
/// times, fixed up by reconciliation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub lag: u64,
    pub lateness: u64,
}

impl Window {
    pub fn of(settings: &Settings) -> Self {
        Self { lag: settings.raw().merge_lag, lateness: settings.raw().max_lateness }
    }

    /// Whether a contribution made for `made_for` may be merged in round `round`.
    /// (Saturating: a round number comes from the network.)
    pub fn eligible(&self, made_for: u64, round: u64) -> bool {
        made_for.saturating_add(self.lag) <= round
            && made_for.saturating_add(self.lag + self.lateness) >= round
    }

    /// Whether a contribution made for `made_for` can no longer be merged after `round`.
    pub fn stale(&self, made_for: u64, round: u64) -> bool {
        made_for.saturating_add(self.lag + self.lateness) < round
    }

    /// Rounds of merged-id log a state must keep to refuse every duplicate.
    pub fn log_rounds(&self) -> u64 {
        self.lateness + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::RawSettings;
    use proptest::prelude::*;

    fn settings(h: u64, p: usize, step: u64) -> Settings {
        Settings::new(RawSettings {
            h,
            fragments: p,
            step_ms: step,
            grace_cap_ms: 0,
            max_wait_ms: Some(0),
            ..RawSettings::default()
        })
        .unwrap()
    }

    proptest! {
        /// Rounds are staggered by `T/P`, and `current_round` inverts `open_time`.
        #[test]
        fn round_of_open_time(h in 1u64..100, p in 1usize..8, step in 10u64..200, r in 1u64..1000, frag in 0usize..8) {
            let s = Schedule::new(&settings(h.max(p as u64), p, step));
            let frag = frag % p;
            let t = s.open_time(frag, r);
            prop_assert_eq!(s.current_round(frag, t), r);
            prop_assert_eq!(s.current_round(frag, t - 1), r - 1);
            prop_assert_eq!(s.next_round(frag, t), r);
            prop_assert_eq!(s.next_round(frag, t + 1), r + 1);
        }
    }

    #[test]
    fn grace_follows_eq3_and_is_capped() {
        let s = Settings::new(RawSettings {
            step_ms: 100,
            gamma: 0.5,
            tau: 2,
            grace_cap_ms: 80,
            ema_weight: 1.0,
            ..RawSettings::default()
        })
        .unwrap();
        let mut g = Grace::new(&s);
        assert_eq!(g.window(), 80); // 0.5·200 = 100, capped at 80
        g.t_quorum.update(60.0);
        g.t_sync.update(20.0);
        assert_eq!(g.window(), 60); // 0.5·(200 − 80)
        g.t_quorum.update(500.0);
        assert_eq!(g.window(), 0);
    }
}
