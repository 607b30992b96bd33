//! atoll-net's gossip envelope: `"ATLA" version:u16be run_len:u8 run_name payload`.
//! The first input byte picks the run name the receiver expects (the rest is the envelope),
//! so both the wrong-run and the right-run paths are reached.
#![no_main]

use atoll_net::announce;
use libfuzzer_sys::fuzz_target;

const RUNS: [&str; 4] = ["run", "atoll-default", "", "r"];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, env)) = data.split_first() else { return };
    let run = RUNS[pick as usize % RUNS.len()];
    if let Ok(payload) = announce::decode(run, env) {
        // A payload that decodes re-wraps to the same envelope.
        assert!(payload.len() <= env.len());
        let again = announce::encode(run, payload).expect("a decoded envelope re-encodes");
        assert_eq!(again, env);
    }
    // The same bytes under a run name taken from the input itself.
    if env.len() > 7 {
        let n = (env[6] as usize).min(env.len() - 7);
        if let Ok(run) = std::str::from_utf8(&env[7..7 + n]) {
            let _ = announce::decode(run, env);
        }
    }
    let _ = announce::topic_name(run);
});
