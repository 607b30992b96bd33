//! Training runs below the network's CPU priority. A peer's event loop and atoll-net serve
//! states to joiners, forward gossip and answer fetches: work that others wait on, and
//! small. Training is bulk work that nobody waits on from one millisecond to the next.
//! On a machine busy with training (three peers on two cores in a test, or a spare
//! machine its owner is using), the network then gets the CPU when it needs it: a 10M
//! model's 87 MB of states reach a joiner in a fraction of the time. On an idle machine
//! nothing changes: niceness only matters when threads compete.

/// How much nicer than the process the training threads are (Linux nice steps; each
/// step is about 1.25× less CPU share under contention).
pub const TRAINING_NICENESS: i32 = 10;

/// Makes the calling thread `TRAINING_NICENESS` nicer than it is (at most 19), so work
/// on it yields to the network's threads. A failure (a platform without per-thread
/// priorities, a sandbox) is logged and otherwise ignored: priority is an optimisation.
pub fn lower_this_thread() {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpriority_process, setpriority_process};
        let tid = rustix::thread::gettid();
        let result = getpriority_process(Some(tid))
            .and_then(|now| setpriority_process(Some(tid), (now + TRAINING_NICENESS).min(19)));
        if let Err(error) = result {
            tracing::debug!(%error, "cannot lower the training thread's priority");
        }
    }
}

/// Starts the process's compute pool (rayon's global pool, on which burn runs its
/// kernels) with every thread lowered as by [`lower_this_thread`]. Call it before any
/// tensor work; once the pool exists it cannot be rebuilt, and this returns `false`.
pub fn lower_compute_pool() -> bool {
    rayon::ThreadPoolBuilder::new().start_handler(|_| lower_this_thread()).build_global().is_ok()
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_lowered_thread_is_nicer_and_its_siblings_are_not() {
        use rustix::process::getpriority_process;
        let before = getpriority_process(Some(rustix::thread::gettid())).unwrap();
        let lowered = std::thread::spawn(|| {
            lower_this_thread();
            getpriority_process(Some(rustix::thread::gettid())).unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(lowered, (before + TRAINING_NICENESS).min(19));
        let after = getpriority_process(Some(rustix::thread::gettid())).unwrap();
        assert_eq!(after, before, "only the calling thread is lowered");
    }
}
