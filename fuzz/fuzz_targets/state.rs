//! A fragment's replicated state on the wire (`FragmentState::from_bytes`), the payload a
//! peer adopts when it reconciles or catches up. Mode 0: the raw input against a small
//! spec; mode 1: a valid `to_bytes()` (fuzzer-chosen anchor, momentum and merged-id log)
//! with bytes overwritten at fuzzer-chosen offsets, truncated or extended.
#![no_main]

use arbitrary::{Result, Unstructured};
use atoll::delta::ContentHash;
use atoll::fragment::{FragmentSpec, TensorSpec};
use atoll::proto::FragmentState;
use libfuzzer_sys::fuzz_target;

fn spec(id: usize, a: usize, b: usize) -> FragmentSpec {
    let t = |name: &str, n: usize| TensorSpec {
        name: name.into(),
        shape: vec![n],
        is_embedding: false,
    };
    FragmentSpec { id, tensors: vec![t("a", a), t("b", b)] }
}

fn check(bytes: &[u8], spec: &FragmentSpec) {
    if let Ok(s) = FragmentState::from_bytes(bytes, spec) {
        assert_eq!(s.anchor.len(), spec.numel());
        assert_eq!(s.momentum.len(), spec.numel());
        assert!(s.anchor.iter().chain(&s.momentum).all(|v| v.is_finite()));
        // Decoding is exact: the wire form and the hash are those of the input bytes.
        assert_eq!(s.wire_len(), bytes.len());
        assert_eq!(s.to_bytes(), bytes);
        assert_eq!(s.hash(), ContentHash::of(bytes));
        for (_, ids) in &s.log {
            for id in ids {
                assert!(s.has_merged(id));
            }
        }
    }
}

fn raw(u: &mut Unstructured) -> Result<()> {
    let id = u.int_in_range(0..=3u8)? as usize;
    let a = u.int_in_range(1..=64u8)? as usize;
    let b = u.int_in_range(1..=36u8)? as usize;
    let n = u.len();
    check(u.bytes(n)?, &spec(id, a, b));
    Ok(())
}

fn structured(u: &mut Unstructured) -> Result<()> {
    let id = u.int_in_range(0..=3u32)?;
    let a = u.int_in_range(1..=64u8)? as usize;
    let b = u.int_in_range(1..=36u8)? as usize;
    let n = a + b;
    let mut anchor = Vec::with_capacity(n);
    for _ in 0..n {
        let v = f32::from_bits(u.arbitrary()?);
        anchor.push(if v.is_finite() { v } else { 0.5 });
    }
    let mut s = FragmentState::initial(id, anchor);
    for m in s.momentum.iter_mut() {
        let v = f32::from_bits(u.arbitrary()?);
        *m = if v.is_finite() { v } else { 0.0 };
    }
    let keep = u.int_in_range(0..=8u64)?;
    let rounds = u.int_in_range(0..=6u8)?;
    let mut round = u.arbitrary::<u64>()? % 1000;
    for _ in 0..rounds {
        round = round.saturating_add(u.int_in_range(0..=3u64)?);
        let k = u.int_in_range(0..=6u8)?;
        let mut ids = Vec::new();
        for _ in 0..k {
            ids.push(atoll::delta::ContentHash(u.arbitrary()?));
        }
        s.record(round, ids, keep);
    }
    s.round = u.arbitrary()?;
    let sp = spec(id as usize, a, b);
    let good = s.to_bytes();
    assert_eq!(good.len(), s.wire_len());
    assert_eq!(s.hash(), ContentHash::of(&good));
    let back = FragmentState::from_bytes(&good, &sp).expect("a fresh state decodes");
    // Finding F2 in fuzz/README.md broke this (index and log disagreed); fixed in 0370565.
    assert_eq!(back, s);
    assert_eq!(back.to_bytes(), good);

    let mut bytes = good;
    for _ in 0..u.int_in_range(0..=6u8)? {
        let at = u.int_in_range(0..=bytes.len() - 1)?;
        match u.int_in_range(0..=2u8)? {
            0 => bytes[at] = u.arbitrary()?,
            1 => bytes[at] ^= 1 << u.int_in_range(0..=7u8)?,
            _ => {
                let v = *u.choose(&[0u32, 1, 127, 128, 129, 1 << 20, (1 << 20) + 1, u32::MAX])?;
                let end = (at + 4).min(bytes.len());
                bytes[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
            }
        }
    }
    match u.int_in_range(0..=3u8)? {
        0 => {
            let n = u.int_in_range(0..=bytes.len())?;
            bytes.truncate(n);
        }
        1 => {
            let extra = {
                let n = u.int_in_range(0..=40usize)?;
                u.bytes(n)?
            };
            bytes.extend_from_slice(extra);
        }
        _ => {}
    }
    check(&bytes, &sp);
    check(&bytes, &spec(id as usize, a + 1, b));
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let _ = match u.arbitrary::<u8>().unwrap_or(0) % 2 {
        0 => raw(&mut u),
        _ => structured(&mut u),
    };
});
