//! Gossip messages: `proto::decode_message` (the binary layout) and the node's
//! `run_id[32] ‖ message` wrapper (`node::wire::decode`). Both face strangers.
#![no_main]

use atoll::node::wire;
use atoll::proto::{decode_message, encode_message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = decode_message(data) {
        // Whatever decodes must re-encode to something that decodes to the same message.
        let again = encode_message(&msg);
        assert_eq!(decode_message(&again).as_ref(), Ok(&msg));
        let _ = msg.fragment();
    }
    if let Ok((run, msg)) = wire::decode(data) {
        let again = wire::encode(&run, &msg);
        assert_eq!(wire::decode(&again), Ok((run, msg)));
    }
});
