//! The run manifest a peer fetches from a stranger (`Manifest::from_bytes`, which
//! validates), its protocol settings, and the round schedule derived from them. Whatever
//! validates must give a schedule that never panics, overflows or divides by zero, at any
//! time on the run's timeline.
//!
//! Mode (first byte): 0 a manifest JSON; 1 a `RawSettings` JSON; 2 `RawSettings` built
//! field by field from the input with edge values (0, 1, u64::MAX, NaN, inf...).
#![no_main]

use arbitrary::{Result, Unstructured};
use atoll::manifest::Manifest;
use atoll::proto::{Grace, MergeRule, RawSettings, Schedule, Settings};
use libfuzzer_sys::fuzz_target;

fn exercise(settings: &Settings) {
    let period = settings.period_ms();
    assert!(period >= 1);
    let s = Schedule::new(settings);
    assert_eq!(s.period(), period);
    let p = settings.raw().fragments;
    let _ = (settings.max_wait_ms(), settings.reconcile_offset_ms(), settings.max_weighted_steps());
    let _ = settings.merge_bounds();
    let _ = Grace::new(settings).window();
    let top = u64::MAX / period;
    let times = [
        0,
        1,
        period - 1,
        period,
        period + 1,
        u64::MAX / 2,
        u64::MAX - period,
        u64::MAX - 1,
        u64::MAX,
    ];
    let rounds = [
        0,
        1,
        2,
        1000,
        top.saturating_sub(2),
        top.saturating_sub(1),
        top,
        top.saturating_add(1),
        u64::MAX,
    ];
    for f in [0, 1, p / 2, p.saturating_sub(1)] {
        if f >= p {
            continue;
        }
        for r in rounds {
            let t = s.open_time(f, r);
            if r >= 1 && r < top {
                // Not saturated: `current_round` inverts `open_time`, rounds are `period` apart.
                assert_eq!(s.current_round(f, t), r);
                assert_eq!(s.next_round(f, t), r);
                if r + 1 < top {
                    assert_eq!(s.open_time(f, r + 1) - t, period);
                }
            }
        }
        for now in times {
            let c = s.current_round(f, now);
            let n = s.next_round(f, now);
            assert!(n >= 1);
            assert!(n >= c);
            let at = s.open_time(f, n);
            assert!(at >= now || at == u64::MAX || n == u64::MAX);
            let _ = s.open_time(f, c);
        }
    }
}

fn raw_settings(u: &mut Unstructured) -> Result<RawSettings> {
    let u64e = |u: &mut Unstructured| -> Result<u64> {
        Ok(match u.int_in_range(0..=4u8)? {
            0 => *u.choose(&[
                0,
                1,
                2,
                3,
                4,
                64,
                65,
                1000,
                4096,
                86_400_000,
                3_600_000,
                1_000_000,
                u64::MAX,
            ])?,
            1 => u.int_in_range(0..=100)?,
            2 => u.int_in_range(0..=100_000)?,
            _ => u.arbitrary()?,
        })
    };
    let f64e = |u: &mut Unstructured| -> Result<f64> {
        Ok(match u.int_in_range(0..=2u8)? {
            0 => *u.choose(&[
                0.0,
                0.5,
                1.0,
                1.5,
                2.0,
                -0.0,
                -1.0,
                1e-300,
                f64::MIN_POSITIVE,
                f64::INFINITY,
                f64::NAN,
                0.999_999_999,
            ])?,
            1 => u.int_in_range(0..=1000u32)? as f64 / 1000.0,
            _ => u.arbitrary()?,
        })
    };
    let d = RawSettings::default();
    let mut r = RawSettings {
        h: u64e(u)?,
        fragments: u64e(u)? as usize,
        step_ms: u64e(u)?,
        quorum: u64e(u)? as usize,
        gamma: f64e(u)?,
        grace_cap_ms: u64e(u)?,
        tau: u64e(u)?,
        ema_weight: f64e(u)?,
        outer_lr: f64e(u)? as f32,
        momentum: f64e(u)? as f32,
        alpha: f64e(u)? as f32,
        merge: *u.choose(&[MergeRule::Rda, MergeRule::Mean, MergeRule::TrimmedMean])?,
        encode: d.encode,
        max_lateness: u64e(u)?,
        merge_lag: u64e(u)?,
        max_wait_ms: if u.arbitrary()? { Some(u64e(u)?) } else { None },
        reconcile_at: f64e(u)?,
        fetch_timeout_ms: u64e(u)?,
        fetch_attempts: u64e(u)? as u32,
        max_held: u64e(u)? as usize,
        max_held_bytes: u64e(u)?,
        max_payload_bytes: u64e(u)? as usize,
        clip_factor: f64e(u)?,
        max_author_share: f64e(u)?,
        trim: f64e(u)?,
        step_slack: u64e(u)?,
        agreement_weights: u.arbitrary()?,
        contributors: u64e(u)? as usize,
        expected_peers: u64e(u)? as usize,
    };
    r.encode.block = u64e(u)? as usize;
    // Each field falls back to its default with some probability, so validation passes
    // often enough for the schedule to be reached.
    let keep: u32 = u.arbitrary()?;
    macro_rules! dflt {
        ($($i:literal $f:ident),*) => { $( if keep & (1 << $i) == 0 { r.$f = d.$f.clone(); } )* };
    }
    dflt!(0 quorum, 1 gamma, 2 tau, 3 ema_weight, 4 outer_lr, 5 momentum, 6 alpha, 7 max_lateness,
          8 merge_lag, 9 max_wait_ms, 10 reconcile_at, 11 fetch_timeout_ms, 12 fetch_attempts,
          13 max_held, 14 max_held_bytes, 15 max_payload_bytes, 16 clip_factor,
          17 max_author_share, 18 trim, 19 step_slack, 20 encode, 21 grace_cap_ms,
          22 contributors, 23 expected_peers);
    Ok(r)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 3 {
        0 => {
            let Ok(m) = Manifest::from_bytes(rest) else { return };
            let settings = m.validate().expect("from_bytes validated it");
            let bytes = m.to_bytes();
            let back = Manifest::from_bytes(&bytes).expect("a valid manifest re-parses");
            assert_eq!(back, m);
            assert_eq!(back.run_id(), m.run_id());
            assert!(m.diff(&back).is_empty());
            let _ = m.run_id().short();
            exercise(&settings);
            let tps = m.train.tokens_per_step() as u64;
            assert_eq!(settings.tokens_per_step(), tps.max(1));
        }
        1 => {
            let Ok(raw) = serde_json::from_slice::<RawSettings>(rest) else { return };
            if let Ok(s) = Settings::new(raw) {
                exercise(&s);
            }
        }
        _ => {
            let mut u = Unstructured::new(rest);
            let Ok(raw) = raw_settings(&mut u) else { return };
            if let Ok(s) = Settings::new(raw) {
                exercise(&s.with_tokens_per_step(u.arbitrary().unwrap_or(0)));
            }
        }
    }
});
