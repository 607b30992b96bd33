//! Shared-mask sparse codes: the positions are not sent. In each block of `block` values,
//! `keep` positions follow from the delta's fragment and round alone, so every peer's
//! delta for a round covers the same positions (the merge sees every contribution on every
//! sent coordinate) and the body holds only values.
//!
//! Positions: a block's `len` values are cut into `keep` slots, slot `s` spanning
//! `[s·len/keep, (s+1)·len/keep)`; the slot sends the position `start + (o + round) mod
//! width`, with `o` a fixed offset mixed from (fragment, block, slot). Each position of a
//! slot is therefore sent once every `width` rounds, in a fixed cyclic order, and what is
//! not sent waits in the sender's error feedback for its turn.
//!
//! Values: as the top-k codes ([`super::sparse`]), a sign and one of two magnitudes per
//! block (2-bit: the means of the smaller and the larger half of the sent magnitudes) or
//! a sign at the block's mean magnitude (1-bit). Body: the levels of every block (f32
//! little-endian), then per sent value its sign bit and, for 2-bit, its level bit, least
//! significant bit first, zero-padded to a byte. Its length follows from the header.

/// Levels stored per block.
fn levels(bits: u32) -> usize {
    if bits == 2 {
        2
    } else {
        1
    }
}

/// Values sent in a stretch of `len` values.
fn sent(len: usize, keep: usize) -> usize {
    keep.min(len)
}

/// Exact body length for `numel` values.
pub(crate) fn body_len(numel: usize, block: usize, keep: usize, bits: u32) -> Option<usize> {
    let blocks = numel.div_ceil(block);
    let full = numel / block;
    let tail = numel - full * block;
    let values = full.checked_mul(sent(block, keep))?.checked_add(sent(tail, keep))?;
    let stream = values.checked_mul(bits as usize)?.div_ceil(8);
    blocks.checked_mul(4 * levels(bits))?.checked_add(stream)
}

/// SplitMix64's finaliser: a fixed integer mix, the same on every machine.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Where a round's values lie in one block of `len` values, in increasing order.
pub(crate) fn positions(
    fragment: u32,
    round: u64,
    block_index: usize,
    len: usize,
    keep: usize,
) -> impl Iterator<Item = usize> {
    let k = sent(len, keep);
    let base = mix(mix(u64::from(fragment)) ^ block_index as u64);
    (0..k).map(move |s| {
        let start = s * len / k;
        let width = ((s + 1) * len / k - start) as u64;
        let offset = mix(base ^ s as u64);
        start + (offset.wrapping_add(round) % width) as usize
    })
}

/// Encodes the round's positions of `x` into `out` (levels, then the bit stream) and
/// returns nothing: the caller decodes the same bytes for its residual. `x` is finite.
pub(crate) fn encode(
    x: &[f32],
    fragment: u32,
    round: u64,
    block: usize,
    keep: usize,
    bits: u32,
    out: &mut Vec<u8>,
) {
    let mut stream = Vec::new();
    let (mut acc, mut n) = (0u64, 0u32);
    let mut mags: Vec<f32> = Vec::with_capacity(keep);
    let mut picked: Vec<f32> = Vec::with_capacity(keep);
    for (b, chunk) in x.chunks(block).enumerate() {
        picked.clear();
        picked.extend(positions(fragment, round, b, chunk.len(), keep).map(|p| chunk[p]));
        mags.clear();
        mags.extend(picked.iter().map(|v| v.abs()));
        let mean = |s: &[f32]| {
            let sum: f64 = s.iter().map(|&m| f64::from(m)).sum();
            if s.is_empty() {
                0.0
            } else {
                (sum / s.len() as f64) as f32
            }
        };
        let (lo, hi) = if bits == 2 {
            // The means of the smaller and the larger half (one step of 2-means).
            let half = mags.len() / 2;
            if half > 0 {
                mags.select_nth_unstable_by(half, f32::total_cmp);
            }
            let (small, big) = mags.split_at(half);
            let hi = mean(big);
            (if small.is_empty() { hi } else { mean(small) }, hi)
        } else {
            let m = mean(&mags);
            (m, m)
        };
        out.extend_from_slice(&lo.to_le_bytes());
        if bits == 2 {
            out.extend_from_slice(&hi.to_le_bytes());
        }
        for &v in &picked {
            let m = v.abs();
            let mut code = u64::from(v < 0.0);
            if bits == 2 {
                code |= u64::from((m - lo).abs() > (hi - m).abs()) << 1;
            }
            acc |= code << n;
            n += bits;
            if n >= 32 {
                stream.extend_from_slice(&(acc as u32).to_le_bytes());
                acc >>= 32;
                n -= 32;
            }
        }
    }
    while n > 0 {
        stream.push(acc as u8);
        acc >>= 8;
        n = n.saturating_sub(8);
    }
    out.extend_from_slice(&stream);
}

/// Why a shared-mask body was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MaskFault {
    /// A level was negative, NaN or infinite.
    BadLevel,
    /// The padding after the last value was not zero.
    BadPadding,
}

/// Inverse of [`encode`]; `body` has exactly [`body_len`] bytes (the caller checks).
pub(crate) fn decode(
    body: &[u8],
    numel: usize,
    fragment: u32,
    round: u64,
    block: usize,
    keep: usize,
    bits: u32,
) -> Result<Vec<f32>, MaskFault> {
    let level_bytes = numel.div_ceil(block) * 4 * levels(bits);
    let (level_bytes, stream) = body.split_at(level_bytes.min(body.len()));
    let lv: Vec<f32> =
        level_bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    if lv.iter().any(|l| !l.is_finite() || *l < 0.0) {
        return Err(MaskFault::BadLevel);
    }
    let mut out = vec![0.0f32; numel];
    let mut pos = 0usize;
    let code = |at: usize| (stream.get(at / 8).copied().unwrap_or(0) >> (at % 8)) & 1 == 1;
    for (b, chunk) in out.chunks_mut(block).enumerate() {
        let (lo, hi) = if bits == 2 { (lv[2 * b], lv[2 * b + 1]) } else { (lv[b], lv[b]) };
        let len = chunk.len();
        for p in positions(fragment, round, b, len, keep) {
            let neg = code(pos);
            let m = if bits == 2 && code(pos + 1) { hi } else { lo };
            chunk[p] = if neg { -m } else { m };
            pos += bits as usize;
        }
    }
    let padding = (stream.len() * 8).saturating_sub(pos);
    if (0..padding).any(|i| code(pos + i)) {
        return Err(MaskFault::BadPadding);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_position_of_a_slot_has_its_turn() {
        // 4096 values, 512 kept: slots of 8; eight consecutive rounds cover the block once.
        let mut seen = vec![0u32; 4096];
        for round in 100..108 {
            let ps: Vec<usize> = positions(2, round, 5, 4096, 512).collect();
            assert_eq!(ps.len(), 512);
            assert!(ps.windows(2).all(|w| w[0] < w[1]), "increasing, one per slot");
            ps.iter().for_each(|&p| seen[p] += 1);
        }
        assert!(seen.iter().all(|&c| c == 1), "each position once in 8 rounds");
        // Another fragment or block has another layout.
        let a: Vec<usize> = positions(2, 100, 5, 4096, 512).collect();
        assert_ne!(a, positions(3, 100, 5, 4096, 512).collect::<Vec<_>>());
        assert_ne!(a, positions(2, 100, 6, 4096, 512).collect::<Vec<_>>());
    }

    #[test]
    fn uneven_slots_and_a_short_tail() {
        for (len, keep) in [(10, 3), (7, 7), (5, 9), (1, 4), (4096, 500)] {
            let ps: Vec<usize> = positions(0, 3, 0, len, keep).collect();
            assert_eq!(ps.len(), keep.min(len));
            assert!(ps.windows(2).all(|w| w[0] < w[1]) && ps.iter().all(|&p| p < len));
        }
    }

    #[test]
    fn a_set_padding_bit_is_refused() {
        let x = [0.5f32, -1.0, 2.0];
        let mut body = Vec::new();
        encode(&x, 0, 1, 8, 3, 1, &mut body);
        assert_eq!(body.len(), body_len(3, 8, 3, 1).unwrap());
        assert!(decode(&body, 3, 0, 1, 8, 3, 1).is_ok());
        *body.last_mut().unwrap() |= 0x80;
        assert_eq!(decode(&body, 3, 0, 1, 8, 3, 1), Err(MaskFault::BadPadding));
    }

    proptest! {
        /// The round's positions carry the value's sign at one of the block's levels;
        /// every other value is zero; the length is the one `body_len` gives.
        #[test]
        fn sends_signs_at_the_rounds_positions(
            x in prop::collection::vec(-10f32..10.0, 1..400),
            block in 8usize..100,
            keep in 1usize..20,
            two in any::<bool>(),
            fragment in 0u32..4,
            round in 0u64..1000,
        ) {
            let bits = if two { 2 } else { 1 };
            let mut body = Vec::new();
            encode(&x, fragment, round, block, keep, bits, &mut body);
            prop_assert_eq!(Some(body.len()), body_len(x.len(), block, keep, bits));
            let y = decode(&body, x.len(), fragment, round, block, keep, bits).unwrap();
            for (b, (cx, cy)) in x.chunks(block).zip(y.chunks(block)).enumerate() {
                let ps: Vec<usize> = positions(fragment, round, b, cx.len(), keep).collect();
                for (i, (&a, &v)) in cx.iter().zip(cy).enumerate() {
                    if ps.contains(&i) {
                        prop_assert!(v == 0.0 || (a < 0.0) == (v < 0.0), "{a} sent as {v}");
                    } else {
                        prop_assert_eq!(v, 0.0);
                    }
                }
            }
        }
    }
}
