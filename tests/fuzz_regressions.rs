//! Inputs found by the fuzz targets in fuzz/ (fuzz/README.md, "Findings"), reduced to
//! direct calls of the public API.
//!
//! Neither finding was a panic: each was an invariant the fuzz harness checks and the
//! library broke (both fixed; these tests failed before the fixes).

use atoll::delta::{self, Codec, DeltaMeta, EncodeOptions, ErrorFeedback, Limits};
use atoll::fragment::{FragmentSpec, TensorSpec};
use atoll::proto::FragmentState;

fn spec(id: usize, n: usize) -> FragmentSpec {
    let t = TensorSpec { name: "w".into(), shape: vec![n], is_embedding: false };
    FragmentSpec { id, tensors: vec![t] }
}

/// F1 (target `delta`, 2026-11-23). An 8-bit block whose absmax is f32::MAX: the scale is
/// `MAX / 127`, code 127 times that rounds up to +inf. `encode` returns `Ok` with
/// `values` holding inf (what it says every receiver decodes), yet `decode` refuses the
/// payload with `NonFinite`. In the protocol the peer announces a delta that every other
/// peer rejects as `BadPayload` (an honest peer gets reported as misbehaving), and the
/// error-feedback residual becomes `MAX - inf = -inf`, so every later `encode` of that
/// fragment fails with `NonFinite` until the feedback is cleared.
#[test]
fn q8_encode_of_f32_max_decodes_or_is_refused() {
    let meta = DeltaMeta { author: 1, fragment: 0, round: 1, tokens: 1, steps: 1 };
    let opts = EncodeOptions { codec: Codec::Q8, block: 8, zstd_level: 0 };
    let values = [f32::MAX; 8];
    let mut fb = ErrorFeedback::new(values.len());
    match delta::encode(meta, &values, Some(&mut fb), &opts) {
        // Refusing to encode is fine...
        Err(_) => {}
        // ...but what is encoded must be finite and decode to what `encode` reported.
        Ok(enc) => {
            assert!(enc.values.iter().all(|v| v.is_finite()), "encode reported {:?}", enc.values);
            let d = delta::decode(&enc.bytes, &spec(0, 8), &Limits::default())
                .expect("an encoded delta decodes");
            assert_eq!(d.values, enc.values);
            assert!(fb.residual().iter().all(|r| r.is_finite()), "residual {:?}", fb.residual());
        }
    }
}

/// F2 (target `state`, 2026-11-23). `FragmentState::record` removes the ids of a round it
/// forgets from the lookup index even when a newer round still kept in the log holds the
/// same id: afterwards `has_merged` says no for an id the log lists, and the state no
/// longer equals its own wire round trip (`from_bytes` rebuilds the index from the log).
/// The protocol itself never records one id in two rounds, but it adopts logs from other
/// peers' state payloads, which may (`from_bytes` accepts repeated ids); after such an
/// adoption the id could be merged a second time once the older round is forgotten.
#[test]
fn record_keeps_ids_that_newer_rounds_still_hold() {
    let id = 0xdada_dada_dada_dada_u64;
    let mut s = FragmentState::initial(2, vec![1.0, 2.0]);
    s.record(1, vec![id], 1);
    s.record(2, vec![id], 1);
    s.record(3, vec![], 1); // forgets round 1; round 2 still lists `id`
    assert!(s.log.iter().any(|(_, ids)| ids.contains(&id)));
    assert!(s.has_merged(id), "the log holds the id but the index lost it");
    let back = FragmentState::from_bytes(&s.to_bytes(), &spec(2, 2)).unwrap();
    assert_eq!(back, s);
}

/// What the fuzz targets check on every run, pinned on the inputs above: the decoders
/// return errors, never panic.
#[test]
fn found_inputs_are_refused_without_panicking() {
    // F1's payload: decode refuses it with an error.
    let meta = DeltaMeta { author: 1, fragment: 0, round: 1, tokens: 1, steps: 1 };
    let opts = EncodeOptions { codec: Codec::Q8, block: 8, zstd_level: 0 };
    if let Ok(enc) = delta::encode(meta, &[f32::MAX; 8], None, &opts) {
        let r = delta::decode(&enc.bytes, &spec(0, 8), &Limits::default());
        assert!(r.is_ok() || matches!(r, Err(delta::DecodeError::NonFinite(_))));
    }
    // F2's state: its wire form decodes.
    let mut s = FragmentState::initial(2, vec![1.0, 2.0]);
    s.record(1, vec![7], 1);
    s.record(2, vec![7], 1);
    s.record(3, vec![], 1);
    assert!(FragmentState::from_bytes(&s.to_bytes(), &spec(2, 2)).is_ok());
}
