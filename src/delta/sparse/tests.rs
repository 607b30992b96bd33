//! Tests of the sparse codes: selection, round trips, the word reader against a bit-by-bit
//! reading of the format, and hostile bodies.

use super::*;
use proptest::prelude::*;

proptest! {
    /// Kept values are the block's largest, come back with their sign and within the
    /// block's level range; the rest are zero; the body fits its bound.
    #[test]
    fn keeps_the_largest_with_their_signs(
        x in prop::collection::vec(-1e3f32..1e3, 1..600),
        block in 8usize..200,
        keep_frac in 1usize..100,
        two in any::<bool>(),
    ) {
        let bits = if two { 2 } else { 1 };
        let keep = (block * keep_frac / 100).max(1);
        let mut body = Vec::new();
        let sent = encode(&x, block, keep, bits, &mut body);
        prop_assert!(body.len() <= max_body_len(x.len(), block, keep, bits).unwrap());
        let y = decode(&body, x.len(), block, keep, bits).unwrap();
        // The encoder's own view is the receivers', bit for bit.
        let bits_of = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
        prop_assert_eq!(bits_of(&sent), bits_of(&y));
        for (bx, by) in x.chunks(block).zip(y.chunks(block)) {
            let k = keep.min(bx.len());
            let mut mags: Vec<f32> = bx.iter().map(|v| v.abs()).collect();
            mags.sort_by(|a, b| b.total_cmp(a));
            let (threshold, max) = (mags[k - 1], mags[0]);
            prop_assert!(by.iter().filter(|v| **v != 0.0).count() <= k);
            for (a, b) in bx.iter().zip(by) {
                if *b != 0.0 {
                    prop_assert!(a.abs() >= threshold, "{a} kept below {threshold}");
                    prop_assert_eq!(*a < 0.0, *b < 0.0);
                    let slack = 1e-6 * max;
                    prop_assert!(b.abs() >= threshold - slack && b.abs() <= max + slack);
                } else {
                    // A value left out is no larger than the smallest kept one.
                    prop_assert!(a.abs() <= threshold || threshold == 0.0);
                }
            }
        }
    }

    /// The word-at-a-time reader decodes every body, valid or with flipped bits, as a
    /// plain bit-by-bit reading of the format does: same values, same refusals.
    #[test]
    fn decodes_as_the_format_reads_bit_by_bit(
        x in prop::collection::vec(-1e3f32..1e3, 1..700),
        block in 8usize..300,
        keep_frac in 1usize..100,
        two in any::<bool>(),
        flips in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        cut in any::<prop::sample::Index>(),
        cut_it in any::<bool>(),
    ) {
        let bits = if two { 2 } else { 1 };
        let keep = (block * keep_frac / 100).max(1);
        let mut body = Vec::new();
        encode(&x, block, keep, bits, &mut body);
        let expect = by_bits(&body, x.len(), block, keep, bits);
        prop_assert!(expect.is_ok());
        prop_assert_eq!(decode(&body, x.len(), block, keep, bits), expect);
        for f in &flips {
            let bit = f.index(body.len() * 8);
            body[bit / 8] ^= 1 << (bit % 8);
        }
        if cut_it {
            body.truncate(cut.index(body.len() + 1));
        }
        let expect = by_bits(&body, x.len(), block, keep, bits);
        prop_assert_eq!(decode(&body, x.len(), block, keep, bits), expect);
    }

    /// Any bytes either decode or are refused; never a panic.
    #[test]
    fn garbage_never_panics(
        body in prop::collection::vec(any::<u8>(), 0..200),
        numel in 1usize..300,
        block in 8usize..64,
        keep in 1usize..8,
        two in any::<bool>(),
    ) {
        let _ = decode(&body, numel, block, keep, if two { 2 } else { 1 });
    }
}

/// The format read one bit at a time (the decoder before it read words): the reference
/// [`decode`] must agree with.
fn by_bits(
    body: &[u8],
    numel: usize,
    block: usize,
    keep: usize,
    bits: u32,
) -> Result<Vec<f32>, SparseFault> {
    let r = rice(block, keep);
    // The levels are read as the decoder reads them; the stream is what this reference reads
    // on its own.
    let (lv, stream) = split_levels(body, numel, block, bits)?;
    let pos = std::cell::Cell::new(0usize);
    let bit = || -> Result<bool, SparseFault> {
        let p = pos.get();
        let b = stream.get(p / 8).ok_or(SparseFault::BadStream)?;
        pos.set(p + 1);
        Ok((b >> (p % 8)) & 1 == 1)
    };
    let mut out = vec![0.0f32; numel];
    for (b, chunk) in out.chunks_mut(block).enumerate() {
        let (lo, hi) = if bits == 2 { (lv[2 * b], lv[2 * b + 1]) } else { (lv[b], lv[b]) };
        let mut next = 0usize;
        for _ in 0..keep.min(chunk.len()) {
            let mut q = 0usize;
            while bit()? {
                q += 1;
                if q << r >= chunk.len() {
                    return Err(SparseFault::BadStream);
                }
            }
            let mut low = 0usize;
            for i in 0..r {
                low |= usize::from(bit()?) << i;
            }
            let p = next + ((q << r) | low);
            if p >= chunk.len() {
                return Err(SparseFault::BadStream);
            }
            let neg = bit()?;
            let high = bits == 2 && bit()?;
            let m = if high { hi } else { lo };
            chunk[p] = if neg { -m } else { m };
            next = p + 1;
        }
    }
    let used = pos.get();
    let mut pad = 0;
    for _ in 0..(8 - used % 8) % 8 {
        pad |= u8::from(bit()?);
    }
    if used.div_ceil(8) != stream.len() || pad != 0 {
        return Err(SparseFault::BadStream);
    }
    Ok(out)
}

#[test]
fn one_bit_sends_signs_at_the_mean_magnitude() {
    let x = [0.1, -4.0, 0.0, 2.0, 0.2, 0.0, 0.0, -0.3];
    let mut body = Vec::new();
    encode(&x, 8, 2, 1, &mut body);
    assert_eq!(decode(&body, 8, 8, 2, 1).unwrap(), vec![0.0, -3.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0]);
}

#[test]
fn two_bits_keep_two_magnitudes() {
    let x = [0.0, -8.0, 1.0, 6.0, 0.0, -1.0, 0.5, 0.0];
    let mut body = Vec::new();
    encode(&x, 8, 4, 2, &mut body);
    let y = decode(&body, 8, 8, 4, 2).unwrap();
    assert_eq!(y, vec![0.0, -7.0, 1.0, 7.0, 0.0, -1.0, 0.0, 0.0]);
    // A trailing byte or a cut one is refused.
    let mut long = body.clone();
    long.push(0);
    assert_eq!(decode(&long, 8, 8, 4, 2), Err(SparseFault::BadStream));
    assert_eq!(decode(&body[..body.len() - 1], 8, 8, 4, 2), Err(SparseFault::BadStream));
    let mut neg = body.clone();
    neg[0..4].copy_from_slice(&(-1.0f32).to_le_bytes());
    assert_eq!(decode(&neg, 8, 8, 4, 2), Err(SparseFault::BadLevel));
}

#[test]
fn the_bound_is_tight_enough_for_the_target() {
    // 64 of 4096 at 2 bits: under 0.25 bits per value, levels included.
    let len = max_body_len(1 << 20, 4096, 64, 2).unwrap();
    assert!((len * 8) as f64 / f64::from(1 << 20) < 0.25, "{len}");
}
