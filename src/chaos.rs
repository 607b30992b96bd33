//! The chaos harness's I/O-free half: a seeded fault schedule (kills with downtime, pauses)
//! for a local swarm, and the figures a run is judged by — goodput, uptime, rejoins —
//! computed from the peers' merge logs and the processes' token counts. `atoll chaos`
//! (`src/cmd/chaos.rs`) runs the processes; everything here is deterministic and tested
//! without them.

use std::collections::HashSet;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::rundir::ledger::MergeRecord;

/// What the schedule draws from.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleConfig {
    pub peers: usize,
    /// Length of the training window (faults happen inside it).
    pub duration_ms: u64,
    /// Mean time between failures of one peer (exponential).
    pub mtbf_ms: u64,
    /// A killed peer stays down this long (uniform in the range) before it restarts.
    pub downtime_ms: (u64, u64),
    /// A paused peer stays stopped this long (uniform in the range).
    pub pause_ms: (u64, u64),
    /// Share of failures that are kills (the rest are pauses).
    pub kill_share: f64,
    /// No fault starts before this (peers find each other and merge first).
    pub warmup_ms: u64,
    /// Every fault is over this long before the window ends, so restarted peers rejoin
    /// and contribute before training stops.
    pub settle_ms: u64,
    pub seed: u64,
}

/// One failure of one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub peer: usize,
    /// Offset from the start of the window.
    pub at_ms: u64,
    pub kind: FaultKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGKILL, then a restart on the same run dir after `down_ms`.
    Kill { down_ms: u64 },
    /// SIGSTOP, then SIGCONT after `for_ms`.
    Pause { for_ms: u64 },
}

impl Fault {
    /// When the peer is back (restarted or resumed).
    pub fn end_ms(&self) -> u64 {
        self.at_ms
            + match self.kind {
                FaultKind::Kill { down_ms } => down_ms,
                FaultKind::Pause { for_ms } => for_ms,
            }
    }
}

/// The faults of a run, by start time. Per peer: exponential gaps with mean `mtbf_ms`
/// between the end of one fault and the start of the next. Across peers: a fault that would
/// leave no peer running at some instant is dropped, so the swarm itself never stops.
pub fn schedule(cfg: &ScheduleConfig) -> Vec<Fault> {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let last_end = cfg.duration_ms.saturating_sub(cfg.settle_ms);
    let mut drawn = Vec::new();
    for peer in 0..cfg.peers {
        let mut t = cfg.warmup_ms;
        loop {
            let u: f64 = rng.random_range(f64::EPSILON..1.0);
            t += (-(cfg.mtbf_ms as f64) * u.ln()) as u64;
            let kind = if rng.random_bool(cfg.kill_share.clamp(0.0, 1.0)) {
                FaultKind::Kill { down_ms: draw(&mut rng, cfg.downtime_ms) }
            } else {
                FaultKind::Pause { for_ms: draw(&mut rng, cfg.pause_ms) }
            };
            let fault = Fault { peer, at_ms: t, kind };
            if fault.end_ms() > last_end {
                break;
            }
            drawn.push(fault);
            t = fault.end_ms();
        }
    }
    drawn.sort_by_key(|f| (f.at_ms, f.peer));
    let mut kept: Vec<Fault> = Vec::new();
    for f in drawn {
        let out_at_start =
            kept.iter().filter(|k| k.at_ms <= f.at_ms && f.at_ms < k.end_ms()).count();
        // Faults kept so far all start no later than `f`, so the most peers out during `f`
        // is reached at its start, or at the start of a later one (none yet).
        if out_at_start + 1 < cfg.peers {
            kept.push(f);
        }
    }
    kept
}

fn draw(rng: &mut ChaCha8Rng, (lo, hi): (u64, u64)) -> u64 {
    if hi <= lo {
        lo
    } else {
        rng.random_range(lo..=hi)
    }
}

/// One process of one peer: from its start to its exit or kill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Incarnation {
    pub peer: usize,
    /// The peer's protocol id (`status.json` `proto_id`).
    pub proto_id: String,
    pub started_unix_ms: u64,
    /// Tokens of the checkpoint it resumed from, and the latest count it reported.
    pub tokens_at_start: u64,
    pub tokens_last: u64,
    /// Started after a kill.
    pub restart: bool,
}

impl Incarnation {
    pub fn computed(&self) -> u64 {
        self.tokens_last.saturating_sub(self.tokens_at_start)
    }
}

/// Tokens that reached a merged anchor ÷ tokens computed. Every contribution counts once
/// however many peers merged it (by content hash); a contribution carries the tokens
/// trained since the previous snapshot of its fragment, so each fragment accounts for
/// all tokens once, and the sum is divided by the number of fragments.
pub fn goodput(incarnations: &[Incarnation], merges: &[MergeRecord], fragments: usize) -> f64 {
    let computed: u64 = incarnations.iter().map(Incarnation::computed).sum();
    if computed == 0 {
        return 0.0;
    }
    useful_tokens(merges, fragments) as f64 / computed as f64
}

/// Tokens that reached the shared model: the sum over distinct contributions (by content
/// hash) of their tokens, divided by the number of fragments each token was counted in.
/// The synchronous baselines record each mean of their group the same way, with one
/// fragment (the whole model), so the figure means the same for every method.
pub fn useful_tokens(merges: &[MergeRecord], fragments: usize) -> u64 {
    let mut seen = HashSet::new();
    let mut merged = 0u64;
    for c in merges.iter().flat_map(|m| &m.contributions) {
        if seen.insert(c.hash.as_str()) {
            merged += c.tokens;
        }
    }
    merged / fragments.max(1) as u64
}

/// Fraction of the periods in `[start, end)` in which some peer merged something.
pub fn uptime(merges: &[MergeRecord], start_unix_ms: u64, end_unix_ms: u64, period_ms: u64) -> f64 {
    let period = period_ms.max(1);
    let periods = end_unix_ms.saturating_sub(start_unix_ms) / period;
    if periods == 0 {
        return 0.0;
    }
    let hit: HashSet<u64> = merges
        .iter()
        .filter(|m| m.unix_ms >= start_unix_ms)
        .map(|m| (m.unix_ms - start_unix_ms) / period)
        .filter(|&i| i < periods)
        .collect();
    hit.len() as f64 / periods as f64
}

/// Restarted incarnations whose deltas some peer merged after they started.
pub fn rejoined(incarnations: &[Incarnation], merges: &[MergeRecord]) -> usize {
    incarnations
        .iter()
        .filter(|i| i.restart)
        .filter(|i| {
            merges.iter().any(|m| {
                m.unix_ms >= i.started_unix_ms
                    && m.contributions.iter().any(|c| c.peer == i.proto_id)
            })
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rundir::ledger::ContributionRecord;

    fn cfg(seed: u64) -> ScheduleConfig {
        ScheduleConfig {
            peers: 4,
            duration_ms: 600_000,
            mtbf_ms: 60_000,
            downtime_ms: (5_000, 20_000),
            pause_ms: (3_000, 10_000),
            kill_share: 0.5,
            warmup_ms: 20_000,
            settle_ms: 60_000,
            seed,
        }
    }

    #[test]
    fn schedule_is_seeded_and_keeps_its_bounds() {
        let c = cfg(7);
        let a = schedule(&c);
        assert_eq!(a, schedule(&c), "same seed, same schedule");
        assert_ne!(a, schedule(&cfg(8)), "another seed, another schedule");
        assert!(a.len() >= 8, "about 4 × 520 s / 72 s faults expected, got {}", a.len());
        assert!(a.iter().any(|f| matches!(f.kind, FaultKind::Kill { .. })));
        assert!(a.iter().any(|f| matches!(f.kind, FaultKind::Pause { .. })));
        for f in &a {
            assert!(f.at_ms >= c.warmup_ms && f.end_ms() <= c.duration_ms - c.settle_ms, "{f:?}");
            match f.kind {
                FaultKind::Kill { down_ms } => assert!((5_000..=20_000).contains(&down_ms)),
                FaultKind::Pause { for_ms } => assert!((3_000..=10_000).contains(&for_ms)),
            }
        }
        for p in 0..c.peers {
            let mine: Vec<_> = a.iter().filter(|f| f.peer == p).collect();
            assert!(mine.windows(2).all(|w| w[0].end_ms() <= w[1].at_ms), "peer {p} overlaps");
        }
    }

    #[test]
    fn some_peer_is_always_running() {
        for seed in 0..50 {
            let c = ScheduleConfig { peers: 2, mtbf_ms: 5_000, ..cfg(seed) };
            let faults = schedule(&c);
            for t in (0..c.duration_ms).step_by(250) {
                let out = faults.iter().filter(|f| f.at_ms <= t && t < f.end_ms()).count();
                assert!(out < c.peers, "seed {seed}: all peers out at {t} ms");
            }
        }
    }

    fn merge(unix_ms: u64, contributions: &[(&str, &str, u64)]) -> MergeRecord {
        MergeRecord {
            unix_ms,
            fragment: 0,
            round: 1,
            contributions: contributions
                .iter()
                .map(|&(peer, hash, tokens)| ContributionRecord {
                    peer: peer.into(),
                    hash: hash.into(),
                    tokens,
                    agreement: 1.0,
                })
                .collect(),
        }
    }

    fn life(peer: usize, id: &str, at: u64, from: u64, to: u64, restart: bool) -> Incarnation {
        Incarnation {
            peer,
            proto_id: id.into(),
            started_unix_ms: at,
            tokens_at_start: from,
            tokens_last: to,
            restart,
        }
    }

    #[test]
    fn goodput_counts_each_contribution_once_per_fragment() {
        // Two peers computed 400 tokens each; with 2 fragments each token shows up twice.
        let lives = [life(0, "a", 0, 0, 400, false), life(1, "b", 0, 0, 400, false)];
        let merges = [
            merge(10, &[("a", "h1", 400), ("b", "h2", 300)]),
            // Peer b merged the same contributions: not counted again.
            merge(11, &[("a", "h1", 400), ("b", "h2", 300)]),
            merge(12, &[("a", "h3", 400), ("b", "h4", 100)]),
        ];
        let g = goodput(&lives, &merges, 2);
        assert!((g - 1_200.0 / 2.0 / 800.0).abs() < 1e-12, "{g}");
        assert_eq!(useful_tokens(&merges, 2), 600);
        // A synchronous group's means cover the whole model: one fragment.
        assert_eq!(useful_tokens(&merges[..1], 1), 700);
        assert_eq!(goodput(&[], &merges, 2), 0.0);
    }

    #[test]
    fn uptime_is_the_share_of_periods_with_a_merge() {
        let merges = [merge(1_050, &[]), merge(1_150, &[]), merge(1_350, &[]), merge(5_000, &[])];
        // Periods of 100 ms from 1000 to 1500: merges in periods 0, 1 and 3 of 5.
        assert!((uptime(&merges, 1_000, 1_500, 100) - 0.6).abs() < 1e-12);
        assert_eq!(uptime(&merges, 1_000, 1_050, 100), 0.0);
    }

    #[test]
    fn a_restart_rejoined_when_a_merge_after_it_holds_its_delta() {
        let lives = [
            life(0, "a", 0, 0, 100, false),
            life(1, "b", 100, 50, 200, true),
            life(2, "c", 100, 50, 200, true),
        ];
        // b contributed before its restart only; c after it.
        let merges = [merge(50, &[("b", "h1", 50)]), merge(150, &[("c", "h2", 50)])];
        assert_eq!(rejoined(&lives, &merges), 1);
    }
}
