use super::*;

#[test]
fn defaults_validate_and_round_trip() {
    let s = Settings::new(RawSettings::default()).unwrap();
    assert_eq!(s.period_ms(), 5000);
    let json = serde_json::to_string(&s).unwrap();
    let back: Settings = serde_json::from_str(&json).unwrap();
    assert_eq!(back, s);
    // A setting added later is left out at its default (the run id stays), and kept
    // when set.
    assert!(!json.contains("feedback_decay"), "{json}");
    let encode = EncodeOptions { feedback_decay: 0.8, ..EncodeOptions::default() };
    let s = Settings::new(RawSettings { encode, ..RawSettings::default() }).unwrap();
    let json = serde_json::to_string(&s).unwrap();
    assert!(json.contains(r#""feedback_decay":0.8"#), "{json}");
    assert_eq!(serde_json::from_str::<Settings>(&json).unwrap(), s);
}

#[test]
fn nonsense_is_refused_with_the_field_name() {
    let bad = RawSettings { quorum: 0, ..RawSettings::default() };
    let e = Settings::new(bad).unwrap_err().to_string();
    assert!(e.contains("quorum"), "{e}");
    // An expected swarm size means nothing without sampling.
    let bad = RawSettings { expected_peers: 1000, ..RawSettings::default() };
    let e = Settings::new(bad).unwrap_err().to_string();
    assert!(e.contains("expected_peers") && e.contains("contributors"), "{e}");
    let good = RawSettings { expected_peers: 1000, contributors: 16, ..RawSettings::default() };
    assert!(Settings::new(good).is_ok());
    // A window too long for the period says how long each is.
    let bad = RawSettings { h: 5, step_ms: 500, grace_cap_ms: 1000, ..RawSettings::default() };
    let e = Settings::new(bad).unwrap_err().to_string();
    assert!(
        e.contains("(2000 ms;") && e.contains("= 1250 ms (period = h × step_ms = 2500 ms)"),
        "{e}"
    );
    // Once in a manifest's error chain, not twice: the message holds it, no source.
    let e = crate::manifest::ManifestError::from(
        Settings::new(RawSettings { quorum: 0, ..RawSettings::default() }).unwrap_err(),
    );
    assert!(std::error::Error::source(&e).is_none(), "{e}");
    assert_eq!(e.to_string().matches("quorum").count(), 1, "{e}");
    // A stranger's manifest cannot set a peer's limits out of reach.
    let d = RawSettings::default;
    for (bad, field) in [
        (RawSettings { max_held_bytes: MAX_HELD_BYTES + 1, ..d() }, "max_held_bytes"),
        (RawSettings { max_payload_bytes: MAX_PAYLOAD_BYTES + 1, ..d() }, "max_payload_bytes"),
        (RawSettings { max_held: MAX_HELD + 1, ..d() }, "max_held"),
        (RawSettings { fetch_attempts: 17, ..d() }, "fetch_attempts"),
        (RawSettings { fetch_timeout_ms: 600_001, ..d() }, "fetch_timeout_ms"),
    ] {
        let e = Settings::new(bad).unwrap_err().to_string();
        assert!(e.contains(field), "{field}: {e}");
    }
    for decay in [-0.5, 1.01, f32::NAN] {
        let encode = EncodeOptions { feedback_decay: decay, ..EncodeOptions::default() };
        let bad = RawSettings { encode, ..d() };
        let field = "encode.feedback_decay";
        let e = Settings::new(bad).unwrap_err().to_string();
        assert!(e.contains(field), "{field}: {e}");
    }
    let bad = RawSettings { momentum: 1.0, ..RawSettings::default() };
    assert!(Settings::new(bad).is_err());
    assert!(serde_json::from_str::<Settings>(r#"{"h": 0}"#).is_err());
    assert!(serde_json::from_str::<RawSettings>(r#"{"typo": 1}"#).is_err());
    // Inside the codec's settings too: a misspelt decay is not silently 1.
    let typo = r#"{"encode": {"codec": "top2", "block": 4096, "keep": 512,
        "zstd_level": 3, "feedback_decy": 0.8}}"#;
    let e = serde_json::from_str::<RawSettings>(typo).unwrap_err().to_string();
    assert!(e.contains("feedback_decy"), "{e}");
}

#[test]
fn a_faster_clock_shrinks_the_windows_and_a_slower_keeps_them() {
    let default = crate::manifest::default_protocol();
    let fast = default.clone().paced(160);
    assert_eq!((fast.step_ms, fast.grace_cap_ms, fast.max_wait_ms), (160, 320, None));
    // `--step-ms 160` on the default run was refused before the windows shrank.
    let stale = RawSettings { step_ms: 160, ..default.clone() };
    assert!(Settings::new(stale).is_err());
    let s = Settings::new(fast).unwrap();
    assert_eq!((s.period_ms(), s.max_wait_ms()), (1600, 640));
    let slow = default.clone().paced(900);
    assert_eq!((slow.step_ms, slow.grace_cap_ms), (900, default.grace_cap_ms));
    let waits = RawSettings { max_wait_ms: Some(1000), ..default }.paced(125);
    assert_eq!((waits.grace_cap_ms, waits.max_wait_ms), (250, Some(500)));
}

proptest::proptest! {
    /// Every preset's run stays valid on any clock a manifest may hold.
    #[test]
    fn a_valid_run_stays_valid_on_any_clock(step_ms in 1u64..=3_600_000, preset in 0usize..4) {
        use clap::ValueEnum;
        let preset = crate::train::preset::Preset::value_variants()[preset];
        let raw = crate::manifest::preset_protocol(preset, preset.train_config(0).optimizer).paced(step_ms);
        proptest::prop_assert!(Settings::new(raw.clone()).is_ok(), "{raw:?}");
    }
}
