use super::*;
use crate::fragment::TensorSpec;
use proptest::prelude::*;

fn spec(id: usize, numel: usize) -> FragmentSpec {
    FragmentSpec {
        id,
        tensors: vec![TensorSpec { name: "w".into(), shape: vec![numel], is_embedding: false }],
    }
}

fn meta(fragment: u32) -> DeltaMeta {
    DeltaMeta { author: 3, fragment, round: 7, tokens: 4096, steps: 8 }
}

/// The payload fits the bound `max_encoded_len` promises.
fn enc_len_ok(x: &[f32], opts: &EncodeOptions) -> bool {
    let enc = encode(meta(3), x, None, opts).unwrap();
    enc.bytes.len() <= max_encoded_len(x.len(), opts).unwrap()
}

fn codec_strategy() -> impl Strategy<Value = Codec> {
    prop_oneof![
        Just(Codec::F32),
        Just(Codec::Q8),
        Just(Codec::Q4),
        Just(Codec::Top2),
        Just(Codec::Top1)
    ]
}

proptest! {
    /// What the receiver decodes is bit-identical to what the sender merges.
    #[test]
    fn round_trip_is_bit_exact(
        x in prop::collection::vec(-10f32..10.0, 1..500),
        codec in codec_strategy(),
        block in 8usize..100,
        level in 0i32..4,
        keep in 1usize..8,
    ) {
        let opts = EncodeOptions { codec, block, zstd_level: level, keep, ..Default::default() };
        prop_assert!(enc_len_ok(&x, &opts));
        let enc = encode(meta(3), &x, None, &opts).unwrap();
        prop_assert_eq!(enc.hash, ContentHash::of(&enc.bytes));
        let dec = decode(&enc.bytes, &spec(3, x.len()), &Limits::default()).unwrap();
        prop_assert_eq!(dec.meta, meta(3));
        prop_assert_eq!(dec.codec, codec);
        let a: Vec<u32> = dec.values.iter().map(|v| v.to_bits()).collect();
        let b: Vec<u32> = enc.values.iter().map(|v| v.to_bits()).collect();
        prop_assert_eq!(a, b);
        if codec == Codec::F32 {
            prop_assert_eq!(&dec.values, &x);
        }
    }

    /// With error feedback the cumulative sent signal tracks the cumulative true signal:
    /// the gap is exactly the current residual, bounded by half a step of the last block.
    #[test]
    fn error_feedback_keeps_the_sum(
        rounds in prop::collection::vec(prop::collection::vec(-1f32..1.0, 64), 1..8),
        four in any::<bool>(),
    ) {
        let codec = if four { Codec::Q4 } else { Codec::Q8 };
        let opts = EncodeOptions { codec, block: 16, zstd_level: 0, keep: 4, ..Default::default() };
        let mut fb = ErrorFeedback::new(64);
        let mut true_sum = vec![0f64; 64];
        let mut sent_sum = vec![0f64; 64];
        for x in &rounds {
            let enc = encode(meta(0), x, Some(&mut fb), &opts).unwrap();
            for i in 0..64 {
                true_sum[i] += f64::from(x[i]);
                sent_sum[i] += f64::from(enc.values[i]);
            }
        }
        let qmax = if four { 7.0 } else { 127.0 };
        for i in 0..64 {
            let gap = (true_sum[i] - sent_sum[i]) as f32;
            prop_assert!((gap - fb.residual()[i]).abs() < 1e-4);
            // |x + r| ≤ 1 + previous bound, so half a step stays below (1 + 1/qmax)/qmax.
            prop_assert!(fb.residual()[i].abs() <= 0.5 * (1.0 + 2.0 / qmax) * (1.0 + 1.0 / qmax) + 1e-4,
                "residual {} too large", fb.residual()[i]);
        }
    }

    /// Top-k with error feedback: what was not sent is exactly the residual, and a value
    /// left out long enough is sent (the residual stays bounded by the block's growth).
    #[test]
    fn sparse_error_feedback_keeps_the_sum(
        rounds in prop::collection::vec(prop::collection::vec(-1f32..1.0, 64), 1..12),
        two in any::<bool>(),
    ) {
        let codec = if two { Codec::Top2 } else { Codec::Top1 };
        let opts = EncodeOptions { codec, block: 16, zstd_level: 0, keep: 2, ..Default::default() };
        let mut fb = ErrorFeedback::new(64);
        let mut gap = vec![0f64; 64];
        for x in &rounds {
            let enc = encode(meta(0), x, Some(&mut fb), &opts).unwrap();
            prop_assert_eq!(enc.values.iter().filter(|v| **v != 0.0).count() <= 8, true);
            for i in 0..64 {
                gap[i] += f64::from(x[i]) - f64::from(enc.values[i]);
            }
        }
        for (g, r) in gap.iter().zip(fb.residual()) {
            prop_assert!((*g as f32 - r).abs() < 1e-4 * (1.0 + g.abs() as f32));
        }
    }

    /// A fading residual: after each delta it holds `decay ×` what that delta did not
    /// send (the input and the carried residual), bit for bit; at 1 the whole rest.
    #[test]
    fn a_fading_residual_carries_its_share_of_what_was_not_sent(
        rounds in prop::collection::vec(prop::collection::vec(-1f32..1.0, 64), 1..6),
        decay in prop_oneof![Just(0f32), Just(1f32), 0f32..1.0],
    ) {
        let opts = EncodeOptions {
            codec: Codec::Top2, block: 16, zstd_level: 0, keep: 2, feedback_decay: decay,
        };
        let mut fb = ErrorFeedback::new(64);
        for x in &rounds {
            let carried: Vec<f32> = x.iter().zip(fb.residual()).map(|(a, r)| a + r).collect();
            let enc = encode(meta(0), x, Some(&mut fb), &opts).unwrap();
            for ((r, c), v) in fb.residual().iter().zip(&carried).zip(&enc.values) {
                prop_assert_eq!(*r, decay * (c - v));
            }
        }
    }

    /// Random bytes never panic the decoder.
    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300), n in 1usize..100) {
        let _ = decode(&bytes, &spec(0, n), &Limits::default());
    }

    /// Corrupting a valid payload anywhere never panics and never yields non-finite values.
    #[test]
    fn mutated_payloads_never_panic(
        x in prop::collection::vec(-5f32..5.0, 8..200),
        codec in codec_strategy(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        level in 0i32..2,
    ) {
        let enc = encode(meta(1), &x, None, &EncodeOptions { codec, block: 32, zstd_level: level, keep: 5, ..Default::default() }).unwrap();
        let mut bytes = enc.bytes.to_vec();
        for (idx, v) in flips {
            let i = idx.index(bytes.len());
            bytes[i] = v;
        }
        if let Ok(d) = decode(&bytes, &spec(1, x.len()), &Limits::default()) {
            prop_assert!(d.values.iter().all(|v| v.is_finite()));
            prop_assert_eq!(d.values.len(), x.len());
        }
    }
}

#[test]
fn four_bit_compresses_about_eight_times() {
    // Smooth-ish Gaussian-like values, as outer deltas are.
    let x: Vec<f32> = (0..65_536).map(|i| ((i as f32) * 0.37).sin() * 0.01).collect();
    let opts = EncodeOptions::default();
    let enc = encode(meta(0), &x, None, &opts).unwrap();
    let ratio = (x.len() * 4) as f64 / enc.bytes.len() as f64;
    assert!(ratio > 6.5, "ratio {ratio}");
}

#[test]
fn top_k_two_bit_is_under_a_quarter_bit_per_value() {
    // 64 of 4096 per block: SparseLoCo's 1.56%.
    let x: Vec<f32> =
        (0..1 << 18).map(|i| ((i as f32) * 0.37).sin() * (1.0 + (i % 7) as f32)).collect();
    let opts = EncodeOptions { codec: Codec::Top2, block: 4096, keep: 64, ..Default::default() };
    let enc = encode(meta(0), &x, None, &opts).unwrap();
    let bits = (enc.bytes.len() * 8) as f64 / x.len() as f64;
    assert!(bits <= 0.25, "{bits} bits per value");
    assert_eq!(enc.values.iter().filter(|v| **v != 0.0).count(), 64 * 64);
}

#[test]
fn a_sparse_header_with_a_bad_keep_is_refused() {
    let x = vec![0.5f32; 40];
    let opts = EncodeOptions {
        codec: Codec::Top2,
        block: 8,
        keep: 2,
        zstd_level: 0,
        ..Default::default()
    };
    let ok = encode(meta(2), &x, None, &opts).unwrap().bytes.to_vec();
    let (s, lim) = (spec(2, 40), Limits::default());
    assert!(decode(&ok, &s, &lim).is_ok());
    for keep in [0u32, 9, u32::MAX] {
        let mut bad = ok.clone();
        bad[60..64].copy_from_slice(&keep.to_le_bytes());
        assert!(matches!(decode(&bad, &s, &lim), Err(DecodeError::BadKeep { .. })), "{keep}");
    }
    // A dense payload must say 0.
    let dense = encode(meta(2), &x, None, &EncodeOptions::default()).unwrap().bytes.to_vec();
    let mut bad = dense.clone();
    bad[60] = 1;
    assert!(matches!(decode(&bad, &s, &lim), Err(DecodeError::BadKeep { .. })));
    // A declared raw length above the sparse bound is refused before decompressing.
    let mut bad = ok.clone();
    bad[44..48].copy_from_slice(&100_000u32.to_le_bytes());
    assert!(matches!(decode(&bad, &s, &lim), Err(DecodeError::BodyLength { .. })));
    // And options the encoder cannot honour are an error, not a panic.
    let wrong = EncodeOptions { keep: 9, ..opts };
    assert_eq!(
        encode(meta(2), &x, None, &wrong).unwrap_err(),
        EncodeError::BadKeep { keep: 9, block: 8 }
    );
    for decay in [-0.1, 1.5, f32::NAN] {
        let wrong = EncodeOptions { feedback_decay: decay, ..opts };
        let err = encode(meta(2), &x, None, &wrong).unwrap_err();
        assert!(matches!(err, EncodeError::BadDecay(_)), "{decay}: {err:?}");
    }
}

#[test]
fn checks_reject_each_kind_of_bad_header() {
    let x = vec![0.5f32; 40];
    let enc = encode(
        meta(2),
        &x,
        None,
        &EncodeOptions { codec: Codec::Q8, block: 8, zstd_level: 0, ..Default::default() },
    )
    .unwrap();
    let ok = enc.bytes.to_vec();
    let s = spec(2, 40);
    let lim = Limits::default();
    assert!(matches!(decode(&ok, &spec(1, 40), &lim), Err(DecodeError::WrongFragment { .. })));
    assert!(matches!(decode(&ok, &spec(2, 41), &lim), Err(DecodeError::WrongLength { .. })));
    assert!(matches!(decode(&ok[..10], &s, &lim), Err(DecodeError::Truncated { .. })));
    assert!(matches!(decode(&ok[..ok.len() - 1], &s, &lim), Err(DecodeError::BodyLength { .. })));
    let small = Limits { max_payload_bytes: 20 };
    assert!(matches!(decode(&ok, &s, &small), Err(DecodeError::TooLarge { .. })));
    let mut bad = ok.clone();
    bad[0] = b'X';
    assert_eq!(decode(&bad, &s, &lim), Err(DecodeError::BadMagic));
    let mut bad = ok.clone();
    bad[4] = 9;
    assert_eq!(decode(&bad, &s, &lim), Err(DecodeError::UnsupportedVersion(9)));
    let mut bad = ok.clone();
    bad[6] = 7;
    assert_eq!(decode(&bad, &s, &lim), Err(DecodeError::UnknownCodec(7)));
    let mut bad = ok.clone();
    bad[7] = 0x80;
    assert_eq!(decode(&bad, &s, &lim), Err(DecodeError::UnknownFlags(0x80)));
    let mut bad = ok.clone();
    bad[28..36].copy_from_slice(&0u64.to_le_bytes());
    assert_eq!(decode(&bad, &s, &lim), Err(DecodeError::ZeroSteps));
    // A huge declared raw length is refused before any allocation.
    let mut bad = ok.clone();
    bad[44..48].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(decode(&bad, &s, &lim), Err(DecodeError::BodyLength { .. })));
    // An infinite scale makes the body corrupt.
    let mut bad = ok.clone();
    bad[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&f32::INFINITY.to_le_bytes());
    assert!(matches!(decode(&bad, &s, &lim), Err(DecodeError::Corrupt(_))));
}

#[test]
fn f32_payload_with_nan_is_refused() {
    let x = vec![1.0f32; 9];
    let enc = encode(
        meta(0),
        &x,
        None,
        &EncodeOptions { codec: Codec::F32, zstd_level: 0, ..Default::default() },
    )
    .unwrap();
    let mut bad = enc.bytes.to_vec();
    bad[HEADER_LEN + 8..HEADER_LEN + 12].copy_from_slice(&f32::NAN.to_le_bytes());
    assert_eq!(decode(&bad, &spec(0, 9), &Limits::default()), Err(DecodeError::NonFinite(2)));
    assert_eq!(
        encode(meta(0), &[f32::NAN], None, &EncodeOptions::default()).unwrap_err(),
        EncodeError::NonFinite(0)
    );
}

#[test]
fn a_compressed_body_as_large_as_the_raw_one_is_refused() {
    // A valid zstd frame padded with a skippable frame still decompresses to the declared
    // raw body, but would let a payload grow past `largest_payload`.
    let x = vec![0.0f32; 64];
    let f32_opts = EncodeOptions { codec: Codec::F32, zstd_level: 0, ..Default::default() };
    let enc = encode(meta(0), &x, None, &f32_opts).unwrap();
    assert_eq!(enc.bytes.len() as u64, largest_payload(64));
    let mut body = zstd::bulk::compress(&[0u8; 256], 3).unwrap();
    body.extend_from_slice(&0x184D_2A50u32.to_le_bytes());
    body.extend_from_slice(&300u32.to_le_bytes());
    body.extend_from_slice(&[7u8; 300]);
    assert_eq!(zstd::bulk::decompress(&body, 256).unwrap(), vec![0u8; 256]);
    let mut bytes = enc.bytes[..HEADER_LEN].to_vec();
    bytes[48..52].copy_from_slice(&(body.len() as u32).to_le_bytes());
    bytes[7] = 1;
    bytes.extend_from_slice(&body);
    assert!(bytes.len() as u64 > largest_payload(64));
    assert!(matches!(
        decode(&bytes, &spec(0, 64), &Limits::default()),
        Err(DecodeError::Corrupt(why)) if why.contains("not smaller")
    ));
}

#[test]
fn zstd_bomb_is_bounded_by_the_spec() {
    // A body that decompresses to more than the declared raw length is refused.
    let x = vec![0.0f32; 64];
    let enc = encode(meta(0), &x, None, &EncodeOptions { codec: Codec::F32, ..Default::default() })
        .unwrap();
    let mut bytes = enc.bytes[..HEADER_LEN].to_vec();
    let bomb = zstd::bulk::compress(&vec![0u8; 1 << 20], 3).unwrap();
    bytes[48..52].copy_from_slice(&(bomb.len() as u32).to_le_bytes());
    bytes[7] = 1;
    bytes.extend_from_slice(&bomb);
    assert!(matches!(
        decode(&bytes, &spec(0, 64), &Limits::default()),
        Err(DecodeError::Decompress(_))
    ));
}
