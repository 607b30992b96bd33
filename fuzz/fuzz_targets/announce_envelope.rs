//! atoll-net's gossip envelope: `version:u16be payload`.
#![no_main]

use atoll_net::announce;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(payload) = announce::decode(data) {
        // A payload that decodes re-wraps to the same envelope.
        assert!(payload.len() < data.len());
        let again = announce::encode(payload).expect("a decoded envelope re-encodes");
        assert_eq!(again, data);
    }
});
