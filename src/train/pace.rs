//! How long an inner step takes on this machine with several peers on it.
//!
//! A run's rounds are wall-clock: a fragment is due every `h × step_ms` ms. A local swarm
//! whose peers step slower than `step_ms` therefore merges every few steps instead of every
//! `h`, and sends that many more bytes per step; one whose peers step faster takes more
//! steps per period. `atoll demo` measures the step here, with all its peers stepping at
//! once, before it writes the manifest, so that a period holds about `h` steps on any
//! machine.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use super::{TrainConfig, TrainError, Trainer};
use crate::backend::Backend;
use crate::data::{Corpus, Shard};

/// The shortest reference step a local swarm is paced at, in ms: a period of at least a
/// second (h = 10), a fragment round every quarter of it, leaves the network of peers that
/// share a loaded machine time to spread and fetch each delta.
pub const MIN_STEP_MS: u64 = 100;

/// The wall time of one inner step of `config` when `peers` trainers step at the same time
/// on this machine, each on its own shard with passes of `micro_batch` rows (0: the whole
/// batch): after one step each to warm up, every trainer steps until `budget` has passed
/// (at least once); the slowest trainer's mean step. Each trainer runs in a rayon pool of
/// its own, as a peer process would.
pub fn measure_step(
    config: &TrainConfig,
    backend: Backend,
    corpus: &Corpus,
    peers: u32,
    micro_batch: usize,
    budget: Duration,
) -> Result<Duration, TrainError> {
    let peers = peers.max(1);
    let start = Barrier::new(peers as usize);
    // Each peer is a process with a thread pool of its own, as many threads as cores. With
    // one pool shared by every trainer here their parallel kernels (the CPU GELU's,
    // `crate::model`) queued behind each other: the demo timed 119 ms, paced at 190 ms and
    // ran 16 steps a period instead of 10 (bench/RESULTS.md, "The demo's timing with a pool
    // per peer").
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let times: Vec<Result<Duration, TrainError>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..peers)
            .map(|index| {
                let start = &start;
                s.spawn(move || {
                    let shard = Shard { index, count: peers };
                    let time =
                        || time_one(config, backend, corpus, shard, micro_batch, budget, start);
                    match rayon::ThreadPoolBuilder::new().num_threads(cores).build() {
                        Ok(pool) => pool.install(time),
                        Err(_) => time(),
                    }
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("a measuring thread panicked")).collect()
    });
    let mut slowest = Duration::ZERO;
    for t in times {
        slowest = slowest.max(t?);
    }
    Ok(slowest)
}

/// One trainer of [`measure_step`]: built and warmed up by a step, then, once every
/// trainer is, stepping until `budget` has passed; its mean step. Every trainer reaches
/// the barrier, built or not, so none waits forever.
fn time_one(
    config: &TrainConfig,
    backend: Backend,
    corpus: &Corpus,
    shard: Shard,
    micro_batch: usize,
    budget: Duration,
    start: &Barrier,
) -> Result<Duration, TrainError> {
    let mut trainer = Trainer::new(config.clone(), backend, corpus, shard).and_then(|mut t| {
        t.set_micro_batch(micro_batch);
        t.step().map(|_| t).map_err(TrainError::from)
    });
    start.wait();
    let began = Instant::now();
    let mut steps = 0;
    if let Ok(t) = &mut trainer {
        while steps == 0 || began.elapsed() < budget {
            t.step()?;
            steps += 1;
        }
        t.read_loss();
    }
    trainer.map(|_| began.elapsed() / steps.max(1))
}

/// The `step_ms` of a local swarm's manifest: a measured step with `margin` for what a peer
/// does besides stepping (validation, encoding, merging, the network), rounded up to 10 ms,
/// and never below `floor` ms ([`MIN_STEP_MS`], or the peers' step floor).
pub fn step_ms(measured: Duration, margin: f64, floor: u64) -> u64 {
    let ms = (measured.as_secs_f64() * 1e3 * margin).ceil() as u64;
    ms.div_ceil(10).saturating_mul(10).max(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_ms_rounds_up_and_keeps_its_floor() {
        let ms = Duration::from_millis;
        assert_eq!(step_ms(ms(400), 1.25, 250), 500);
        assert_eq!(step_ms(ms(401), 1.0, 250), 410);
        assert_eq!(step_ms(ms(100), 1.25, 250), 250);
        assert_eq!(step_ms(Duration::ZERO, 1.25, 0), 0);
        assert_eq!(step_ms(ms(90), 1.0, 95), 95);
        assert_eq!(step_ms(ms(111), 1.2, 100), 140);
    }

    #[test]
    fn a_step_is_measured_with_every_peer_stepping() {
        let corpus = Corpus::embedded().unwrap();
        let config = TrainConfig::tiny(1);
        let budget = Duration::from_millis(200);
        let step = measure_step(&config, Backend::Flex, &corpus, 2, 1, budget).unwrap();
        assert!(step > Duration::ZERO && step < Duration::from_secs(5), "{step:?}");
        let mut bad = config.clone();
        bad.batch = 0;
        assert!(measure_step(&bad, Backend::Flex, &corpus, 2, 0, budget).is_err());
    }
}
