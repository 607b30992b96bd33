//! Inputs found by the fuzz targets in fuzz/ (fuzz/README.md, "Findings"), reduced to
//! direct calls of the public API.
//!
//! F1 and F2 were invariants the fuzz harness checks and the library broke; F3 was a
//! panic inside burn on a crafted checkpoint. All fixed; each test failed before its fix.

use atoll::delta::{self, Codec, ContentHash, DeltaMeta, EncodeOptions, ErrorFeedback, Limits};
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
    let opts = EncodeOptions { codec: Codec::Q8, block: 8, zstd_level: 0, ..Default::default() };
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
    let id = ContentHash([0xda; 32]);
    let mut s = FragmentState::initial(2, vec![1.0, 2.0]);
    s.record(1, vec![id], 1);
    s.record(2, vec![id], 1);
    s.record(3, vec![], 1); // forgets round 1; round 2 still lists `id`
    assert!(s.log.iter().any(|(_, ids)| ids.contains(&id)));
    assert!(s.has_merged(&id), "the log holds the id but the index lost it");
    let back = FragmentState::from_bytes(&s.to_bytes(), &spec(2, 2)).unwrap();
    assert_eq!(back, s);
}

/// What the fuzz targets check on every run, pinned on the inputs above: the decoders
/// return errors, never panic.
#[test]
fn found_inputs_are_refused_without_panicking() {
    // F1's payload: decode refuses it with an error.
    let meta = DeltaMeta { author: 1, fragment: 0, round: 1, tokens: 1, steps: 1 };
    let opts = EncodeOptions { codec: Codec::Q8, block: 8, zstd_level: 0, ..Default::default() };
    if let Ok(enc) = delta::encode(meta, &[f32::MAX; 8], None, &opts) {
        let r = delta::decode(&enc.bytes, &spec(0, 8), &Limits::default());
        assert!(r.is_ok() || matches!(r, Err(delta::DecodeError::NonFinite(_))));
    }
    // F2's state: its wire form decodes.
    let mut s = FragmentState::initial(2, vec![1.0, 2.0]);
    s.record(1, vec![ContentHash([7; 32])], 1);
    s.record(2, vec![ContentHash([7; 32])], 1);
    s.record(3, vec![], 1);
    assert!(FragmentState::from_bytes(&s.to_bytes(), &spec(2, 2)).is_ok());
}

/// Fuzz finding F3 (`checkpoint`, 10-minute run): a checkpoint whose model record stores a
/// float parameter as U32 (with a valid trailer, so only a crafted file gets here) made
/// burn panic in `Tensor::from_data` while restoring. Now a clear error.
#[test]
fn a_model_record_with_an_integer_dtype_is_an_error_not_a_panic() {
    use atoll::backend::Backend;
    use atoll::checkpoint;
    use atoll::data::{Corpus, Shard};
    use atoll::train::{TrainConfig, Trainer};

    let mut config = TrainConfig::tiny(1);
    config.model = config.model.with_d_model(8).with_n_heads(2).with_d_ff(16).with_context(8);
    config.batch = 2;
    let corpus = Corpus::from_text("f3", b"To be, or not to be.\n".repeat(200)).unwrap();
    let shard = Shard { index: 0, count: 1 };
    let dir = tempfile::tempdir().unwrap();
    let trainer = Trainer::new(config, Backend::Flex, &corpus, shard).unwrap();
    let path = checkpoint::save(&trainer, shard, &corpus, dir.path()).unwrap();
    let mut file = std::fs::read(&path).unwrap();
    // Header: magic, version, then the meta / model / optim lengths; blake3 trailer.
    let len =
        |f: &[u8], i: usize| u64::from_le_bytes(f[12 + 8 * i..20 + 8 * i].try_into().unwrap());
    let model_at = 36 + len(&file, 0) as usize;
    let model_end = model_at + len(&file, 1) as usize;
    // The record's metadata is CBOR: the dtype of each tensor is the text "F32".
    let f32_tag = b"\x63F32";
    let at = file[model_at..model_end]
        .windows(4)
        .position(|w| w == f32_tag)
        .expect("a dtype in the model record")
        + model_at;
    file[at..at + 4].copy_from_slice(b"\x63U32");
    let body = file.len() - 32;
    let trailer = *blake3::hash(&file[..body]).as_bytes();
    file[body..].copy_from_slice(&trailer);
    std::fs::write(&path, &file).unwrap();
    let loaded = checkpoint::load(&path).expect("the trailer matches");
    let Err(err) = loaded.into_trainer(&corpus) else { panic!("restoring must fail") };
    assert!(err.to_string().contains("checkpoint tensors"), "{err}");
}
