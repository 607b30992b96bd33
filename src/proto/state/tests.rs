//! The state's wire form and its refusals.

use super::*;
use crate::fragment::TensorSpec;
use proptest::prelude::*;

fn spec(n: usize) -> FragmentSpec {
    FragmentSpec {
        id: 1,
        tensors: vec![TensorSpec { name: "w".into(), shape: vec![n], is_embedding: false }],
    }
}

proptest! {
    #[test]
    fn round_trip_and_hash(
        anchor in prop::collection::vec(-5f32..5.0, 1..50),
        ids in prop::collection::vec(prop::collection::vec(any::<[u8; 32]>(), 0..10), 0..5),
    ) {
        let mut s = FragmentState::initial(1, anchor.clone());
        for (i, round_ids) in ids.into_iter().enumerate() {
            s.record(i as u64 + 1, round_ids.into_iter().map(ContentHash).collect(), 3);
        }
        let bytes = s.to_bytes();
        prop_assert_eq!(bytes.len(), s.wire_len());
        prop_assert_eq!(ContentHash::of(&bytes), s.hash());
        let back = FragmentState::from_bytes(&bytes, &spec(anchor.len())).unwrap();
        prop_assert_eq!(back, s);
    }

    #[test]
    fn hostile_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200), n in 1usize..8) {
        let _ = FragmentState::from_bytes(&bytes, &spec(n));
    }
}

#[test]
fn values_spanning_several_blocks_keep_their_layout_and_hash() {
    // Past two blocks of `FLOATS_PER_PUT`, with a partial last one.
    let n = 2 * FLOATS_PER_PUT + 7;
    let anchor: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
    let mut s = FragmentState::initial(1, anchor.clone());
    s.momentum = anchor.iter().map(|v| -v).collect();
    let bytes = s.to_bytes();
    // Magic, version, fragment, round, parent and length come first: 54 bytes.
    let values: Vec<u8> = anchor.iter().chain(&s.momentum).flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(&bytes[54..54 + values.len()], &values[..]);
    assert_eq!((bytes.len(), ContentHash::of(&bytes)), (s.wire_len(), s.hash()));
    assert_eq!(FragmentState::from_bytes(&bytes, &spec(n)).unwrap(), s);
}

fn id(n: u64) -> ContentHash {
    ContentHash::of(&n.to_le_bytes())
}

#[test]
fn log_forgets_old_rounds() {
    let mut s = FragmentState::initial(1, vec![0.0]);
    for r in 1..=10 {
        s.record(r, vec![id(r)], 3);
    }
    assert_eq!(s.log.len(), 4);
    assert!(s.has_merged(&id(10)) && s.has_merged(&id(7)) && !s.has_merged(&id(6)));
}

#[test]
fn sampled_states_round_trip_and_unsampled_ones_keep_their_form() {
    let version = |b: &[u8]| u16::from_le_bytes([b[4], b[5]]);
    let mut s = FragmentState::initial(1, vec![1.0, 2.0, 3.0]);
    s.record_merge(1, vec![id(1)], 0, 3, 0);
    assert!(s.sampling.is_default());
    assert_eq!(version(&s.to_bytes()), STATE_WIRE_VERSION_UNSAMPLED);
    // Two merged with one wanted a round: every other round from now on.
    s.record_merge(2, vec![id(2), id(3)], 0, 3, 1);
    assert_eq!((s.sampling.swarm, s.sampling.period, s.sampling.prev_period), (2, 2, 1));
    let b = s.to_bytes();
    assert_eq!(
        (version(&b), b.len(), s.hash()),
        (STATE_WIRE_VERSION, s.wire_len(), ContentHash::of(&b))
    );
    assert_eq!(FragmentState::from_bytes(&b, &spec(3)).unwrap(), s);
    // A v4 payload's periods must be in range, and its sampling not the default.
    let n = b.len();
    let mut zero = b.clone();
    zero[n - 8..n - 4].copy_from_slice(&0u32.to_le_bytes());
    assert!(FragmentState::from_bytes(&zero, &spec(3)).is_err());
    let mut default = b.clone();
    default[n - 12..].copy_from_slice(&[0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]);
    assert!(FragmentState::from_bytes(&default, &spec(3)).is_err());
}

#[test]
fn truncation_and_nan_are_refused() {
    let s = FragmentState::initial(1, vec![1.0, 2.0]);
    let bytes = s.to_bytes();
    assert!(FragmentState::from_bytes(&bytes[..bytes.len() - 1], &spec(2)).is_err());
    let mut bad = bytes.clone();
    bad[54..58].copy_from_slice(&f32::NAN.to_le_bytes()); // the first anchor value
    assert_eq!(FragmentState::from_bytes(&bad, &spec(2)), Err(StateError::NonFinite));
    assert!(matches!(
        FragmentState::from_bytes(&bytes, &spec(3)),
        Err(StateError::WrongLength { .. })
    ));
}
