use proptest::prelude::*;

use super::*;

fn sample() -> Heartbeat {
    Heartbeat {
        version: "0.1.0".into(),
        trains: true,
        manifest: Some("0123456789abcdef".into()),
        step: 1234,
        tokens_per_s: 5120.5,
        val_bpb: Some(3.25),
        rounds: vec![10, 10, 9, 9],
        anchors: ["0123456789ab", "0123456789ab", "ba9876543210", "ffffffffffff"]
            .map(String::from)
            .to_vec(),
        merges: 37,
        reachability: Reachability::Private,
        run_peers: 3,
        sent_unix_ms: 1_764_000_000_000,
    }
}

#[test]
fn round_trip() {
    let hb = sample();
    assert_eq!(decode(&encode(&hb)).unwrap(), hb);
    // The default run (4 fragments) sends 112 bytes (before gossipsub's signed envelope).
    assert_eq!(encode(&hb).len(), 112);
    let relay = Heartbeat {
        trains: false,
        manifest: None,
        val_bpb: None,
        rounds: Vec::new(),
        anchors: Vec::new(),
        reachability: Reachability::Public,
        ..sample()
    };
    assert_eq!(decode(&encode(&relay)).unwrap(), relay);
}

#[test]
fn the_largest_heartbeat_fits_the_bounds() {
    let hb = Heartbeat {
        version: "x".repeat(MAX_VERSION_LEN),
        rounds: vec![u64::MAX; MAX_ROUNDS],
        anchors: vec!["f".repeat(ANCHOR_HEX); MAX_ROUNDS],
        ..sample()
    };
    let bytes = encode(&hb);
    assert_eq!(bytes.len(), MAX_ENCODED);
    assert_eq!(decode(&bytes).unwrap(), hb);
}

#[test]
fn the_encoder_never_writes_what_the_decoder_refuses() {
    let wild = Heartbeat {
        version: "1.0.0 (some \u{1F600} build) with a very long suffix indeed".into(),
        manifest: Some("not hex".into()),
        tokens_per_s: f32::NAN,
        val_bpb: Some(f32::INFINITY),
        rounds: vec![1; 200],
        anchors: vec!["not hex at all".into(); 200],
        sent_unix_ms: u64::MAX,
        ..sample()
    };
    let back = decode(&encode(&wild)).unwrap();
    assert_eq!(back.version.len(), MAX_VERSION_LEN);
    assert_eq!(back.manifest, None);
    assert_eq!(back.tokens_per_s, 0.0);
    assert_eq!(back.val_bpb, None);
    assert_eq!(back.rounds.len(), MAX_ROUNDS);
    assert!(back.anchors.is_empty());
    assert_eq!(back.sent_unix_ms, MAX_UNIX_MS);
    // Fewer anchors than rounds: none are sent (they would not say which is which).
    let short = Heartbeat { anchors: vec!["0123456789ab".into()], ..sample() };
    assert!(decode(&encode(&short)).unwrap().anchors.is_empty());
}

#[test]
fn an_older_peers_v1_heartbeat_is_read_and_may_not_carry_anchors() {
    let v1 = Heartbeat { anchors: Vec::new(), ..sample() };
    let mut bytes = encode(&v1);
    bytes[4] = 1;
    assert_eq!(decode(&bytes).unwrap(), v1);
    let mut with_anchors = encode(&sample());
    with_anchors[4] = 1;
    assert_eq!(decode(&with_anchors), Err(HeartbeatError::Field("unknown flags")));
}

#[test]
fn truncated_trailing_and_oversized_input_is_refused() {
    let bytes = encode(&sample());
    for cut in 0..bytes.len() {
        assert!(decode(&bytes[..cut]).is_err(), "truncated at {cut}");
    }
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert_eq!(decode(&trailing), Err(HeartbeatError::Trailing(1)));
    assert_eq!(decode(&vec![0; MAX_ENCODED + 1]), Err(HeartbeatError::TooLarge(MAX_ENCODED + 1)));
}

/// Offsets into [`sample`]'s encoding: magic 0..4, version 4, flags 5, reachability 6,
/// vlen 7, "0.1.0" 8..13, manifest 13..21, step 21..29, tokens/s 29..33, val_bpb 33..37,
/// merges 37..45, run peers 45..47, clock 47..55, round count 55.
#[test]
fn hostile_fields_are_refused() {
    let bytes = encode(&sample());
    let with = |at: usize, new: &[u8]| {
        let mut b = bytes.clone();
        b[at..at + new.len()].copy_from_slice(new);
        decode(&b)
    };
    assert_eq!(with(0, b"ATLA"), Err(HeartbeatError::Magic));
    assert_eq!(with(4, &[3]), Err(HeartbeatError::Version(3)));
    assert_eq!(with(5, &[0x80 | 7]), Err(HeartbeatError::Field("unknown flags")));
    assert_eq!(with(6, &[3]), Err(HeartbeatError::Field("reachability")));
    assert_eq!(with(7, &[200]), Err(HeartbeatError::Field("version length")));
    assert_eq!(with(8, b"0 1"), Err(HeartbeatError::Field("version")));
    assert_eq!(with(8, &[0xff]), Err(HeartbeatError::Field("version")));
    let nan = f32::NAN.to_be_bytes();
    assert_eq!(with(29, &nan), Err(HeartbeatError::Field("tokens_per_s")));
    assert_eq!(with(29, &(-1.0f32).to_be_bytes()), Err(HeartbeatError::Field("tokens_per_s")));
    assert_eq!(with(33, &1e9f32.to_be_bytes()), Err(HeartbeatError::Field("val_bpb")));
    assert_eq!(with(47, &u64::MAX.to_be_bytes()), Err(HeartbeatError::Field("sent_unix_ms")));
    assert_eq!(with(55, &[65]), Err(HeartbeatError::Field("round count")));
    // A round count larger than what follows is truncation, not an allocation.
    assert_eq!(with(55, &[64]), Err(HeartbeatError::Truncated));
}

fn valid_heartbeat() -> impl Strategy<Value = Heartbeat> {
    (
        "[0-9A-Za-z.+_-]{0,32}",
        any::<bool>(),
        proptest::option::of("[0-9a-f]{16}"),
        any::<u64>(),
        0.0f32..MAX_TOKENS_PER_S,
        proptest::option::of(0.0f32..MAX_VAL_BPB),
        proptest::collection::vec(any::<u64>(), 0..=MAX_ROUNDS),
        any::<u64>(),
        0u8..3,
        any::<u16>(),
        0..=MAX_UNIX_MS,
    )
        .prop_map(
            |(version, trains, manifest, step, tps, val_bpb, rounds, merges, r, peers, t)| {
                Heartbeat {
                    version,
                    trains,
                    manifest,
                    step,
                    tokens_per_s: tps,
                    val_bpb,
                    anchors: if trains {
                        rounds.iter().map(|r| format!("{:012x}", r >> 16)).collect()
                    } else {
                        Vec::new()
                    },
                    rounds,
                    merges,
                    reachability: [
                        Reachability::Unknown,
                        Reachability::Public,
                        Reachability::Private,
                    ][r as usize],
                    run_peers: peers,
                    sent_unix_ms: t,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_valid_heartbeat_round_trips(hb in valid_heartbeat()) {
        prop_assert_eq!(decode(&encode(&hb)).unwrap(), hb);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1200)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn mutated_heartbeats_never_panic(
        hb in valid_heartbeat(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = encode(&hb);
        for (at, v) in flips {
            let i = at % bytes.len();
            bytes[i] = v;
        }
        if let Ok(back) = decode(&bytes) {
            // Whatever decodes is within the bounds, and the encoding is canonical: it
            // re-encodes to the very bytes it came from.
            prop_assert!(back.rounds.len() <= MAX_ROUNDS && back.version.len() <= MAX_VERSION_LEN);
            prop_assert!(back.tokens_per_s.is_finite() && back.sent_unix_ms <= MAX_UNIX_MS);
            prop_assert_eq!(encode(&back), bytes);
        }
    }
}
