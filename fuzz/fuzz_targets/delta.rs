//! The outer-delta codec (`atoll::delta::decode`), the payload every peer fetches from
//! strangers. Two modes, picked by the first input byte:
//!
//! - raw: a small two-tensor `FragmentSpec` built from the next bytes, the rest is the
//!   payload as it is;
//! - structured: a valid payload made with `delta::encode` from fuzzer-chosen meta, codec,
//!   block, zstd level and values, then bytes overwritten at fuzzer-chosen offsets (most of
//!   them in the 64-byte header) and optionally truncated or extended, so the fuzzer gets
//!   past the magic and the length checks and into zstd, the dequantiser and the sparse
//!   code stream.
#![no_main]

use arbitrary::{Result, Unstructured};
use atoll::delta::{self, Codec, DeltaMeta, EncodeOptions, Limits, HEADER_LEN};
use atoll::fragment::{FragmentSpec, TensorSpec};
use libfuzzer_sys::fuzz_target;

fn spec(id: usize, a: usize, b: usize) -> FragmentSpec {
    let t = |name: &str, n: usize, emb: bool| TensorSpec {
        name: name.into(),
        shape: vec![n],
        is_embedding: emb,
    };
    FragmentSpec { id, tensors: vec![t("a", a, false), t("b", b, true)] }
}

fn check(bytes: &[u8], spec: &FragmentSpec, limits: &Limits) {
    if let Ok(d) = delta::decode(bytes, spec, limits) {
        assert_eq!(d.values.len(), spec.numel());
        assert!(d.values.iter().all(|v| v.is_finite()));
        assert_eq!(d.meta.fragment as usize, spec.id);
        assert!(d.meta.steps >= 1);
        assert!(bytes.len() <= limits.max_payload_bytes);
    }
}

fn raw(u: &mut Unstructured) -> Result<()> {
    let id = u.int_in_range(0..=3u8)? as usize;
    let a = u.int_in_range(1..=80u8)? as usize;
    let b = u.int_in_range(1..=40u8)? as usize;
    let limit = if u.arbitrary::<bool>()? { usize::MAX } else { u.int_in_range(0..=4096usize)? };
    let n = u.len();
    let payload = u.bytes(n)?;
    check(payload, &spec(id, a, b), &Limits { max_payload_bytes: limit });
    Ok(())
}

fn structured(u: &mut Unstructured) -> Result<()> {
    let a = u.int_in_range(1..=80u8)? as usize;
    let b = u.int_in_range(1..=40u8)? as usize;
    let meta = DeltaMeta {
        author: u.arbitrary()?,
        fragment: u.int_in_range(0..=3u32)?,
        round: u.arbitrary()?,
        tokens: u.arbitrary()?,
        steps: u.arbitrary::<u64>()?.max(1),
    };
    let codec = *u.choose(&[Codec::Q4, Codec::Q8, Codec::F32, Codec::Top2, Codec::Top1])?;
    let block = *u.choose(&[8usize, 16, 64, 100, 65_536])?;
    let zstd_level = *u.choose(&[0i32, 1, 3])?;
    let keep = u.int_in_range(1..=block.min(80))?;
    let opts = EncodeOptions { codec, block, zstd_level, keep, ..Default::default() };
    let scale = *u.choose(&[1e-3f32, 1.0, 1e30, 3e38])?;
    let mut values = Vec::with_capacity(a + b);
    for _ in 0..a + b {
        let v = match u.int_in_range(0..=3u8)? {
            0 => 0.0,
            1 => (u.arbitrary::<i16>()? as f32) / 32768.0 * scale,
            2 => f32::from_bits(u.arbitrary()?),
            _ => scale,
        };
        values.push(if v.is_finite() { v } else { 0.0 });
    }
    let s = spec(meta.fragment as usize, a, b);
    let limits = Limits::default();
    let enc = match delta::encode(meta, &values, None, &opts) {
        Ok(e) => e,
        Err(_) => return Ok(()),
    };
    // The untouched payload decodes to exactly what the encoder says receivers get
    // (finding F1 in fuzz/README.md broke this; fixed in 0370565).
    let d = delta::decode(&enc.bytes, &s, &limits).expect("a fresh encoding decodes");
    assert_eq!(d.meta, meta);
    assert_eq!(d.codec, codec);
    assert_eq!(d.values, enc.values);

    let mut bytes = enc.bytes.to_vec();
    let edits = u.int_in_range(0..=8u8)?;
    for _ in 0..edits {
        if bytes.is_empty() {
            break;
        }
        let header_only = u.arbitrary::<bool>()?;
        let span = if header_only { HEADER_LEN.min(bytes.len()) } else { bytes.len() };
        let at = u.int_in_range(0..=span - 1)?;
        match u.int_in_range(0..=2u8)? {
            0 => bytes[at] = u.arbitrary()?,
            1 => bytes[at] ^= 1 << u.int_in_range(0..=7u8)?,
            _ => {
                // A whole little-endian u32 field (lengths, numel, block) set to an edge value.
                let v = *u.choose(&[0u32, 1, 7, 8, 65_536, 65_537, u32::MAX, (a + b) as u32])?;
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
                let n = u.int_in_range(0..=32usize)?;
                u.bytes(n)?
            };
            bytes.extend_from_slice(extra);
        }
        _ => {}
    }
    check(&bytes, &s, &limits);
    // And against a spec that disagrees on the shape.
    check(&bytes, &spec(meta.fragment as usize, b, a + 1), &limits);
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let _ = match u.arbitrary::<u8>().unwrap_or(0) % 2 {
        0 => raw(&mut u),
        _ => structured(&mut u),
    };
});
