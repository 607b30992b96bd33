//! Top-k sparse codes: in each block the `keep` largest values by magnitude, each sent as
//! a sign and one of two magnitudes (2-bit) or a sign alone with the block's mean
//! magnitude (1-bit); everything else is zero (and stays in the sender's error feedback).
//!
//! Body: the levels of every block (2-bit: `lo`, `hi`; 1-bit: `m`; f32 little-endian),
//! then one bit stream, least significant bit first. Per block, for each kept value in
//! increasing position: the gap to the previous kept position (Rice code with parameter
//! `r = ⌊log2(block / keep)⌋`: `gap >> r` in unary as ones ended by a zero, then the `r`
//! low bits), a sign bit (1 negative), and for 2-bit a magnitude bit (1 `hi`). The stream
//! ends zero-padded to a byte.
//!
//! Why these choices: sorted positions of `keep` in `block` cost about `log2(block/keep) +
//! 2` bits each in Rice code against `log2(block)` fixed; a decoded value is a stored f32
//! or its negation — no arithmetic — so every peer gets the same floats bit for bit.

/// Rice parameter for `keep` of `block` positions.
pub(crate) fn rice(block: usize, keep: usize) -> u32 {
    (block / keep.max(1)).max(1).ilog2()
}

fn levels(bits: u32) -> usize {
    if bits == 2 {
        2
    } else {
        1
    }
}

/// Largest body for `numel` values: levels, then at most `keep × (r + 2 + bits − 1)` bits
/// of codes plus `block >> r` unary ones per block (the gaps of a block sum to less than
/// its length).
pub(crate) fn max_body_len(numel: usize, block: usize, keep: usize, bits: u32) -> Option<usize> {
    let r = rice(block, keep) as usize;
    let mut stream_bits = 0usize;
    let mut blocks = 0usize;
    let mut start = 0usize;
    // Full blocks alike, then the tail.
    let full = numel / block;
    let per_block = |len: usize| -> Option<usize> {
        let k = keep.min(len);
        k.checked_mul(r + 1 + bits as usize)?.checked_add(len >> r)
    };
    if full > 0 {
        stream_bits = per_block(block)?.checked_mul(full)?;
        blocks = full;
        start = full * block;
    }
    if start < numel {
        stream_bits = stream_bits.checked_add(per_block(numel - start)?)?;
        blocks += 1;
    }
    blocks.checked_mul(4 * levels(bits))?.checked_add(stream_bits.div_ceil(8))
}

struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    n: u32,
}

impl BitWriter<'_> {
    fn put(&mut self, value: u64, bits: u32) {
        debug_assert!(bits <= 32);
        self.acc |= (value & ((1u64 << bits) - 1)) << self.n;
        self.n += bits;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    fn ones(&mut self, mut count: usize) {
        while count >= 32 {
            self.put(u64::from(u32::MAX), 32);
            count -= 32;
        }
        self.put((1u64 << count) - 1, count as u32);
    }

    fn finish(mut self) {
        if self.n > 0 {
            self.out.push(self.acc as u8);
            self.n = 0;
        }
    }
}

struct BitReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl BitReader<'_> {
    fn bit(&mut self) -> Option<bool> {
        let b = *self.bytes.get(self.pos / 8)?;
        let v = (b >> (self.pos % 8)) & 1 == 1;
        self.pos += 1;
        Some(v)
    }

    fn bits(&mut self, n: u32) -> Option<usize> {
        let mut v = 0usize;
        for i in 0..n {
            v |= usize::from(self.bit()?) << i;
        }
        Some(v)
    }
}

/// Encodes `x` into `out` (levels, then the bit stream).
pub(crate) fn encode(x: &[f32], block: usize, keep: usize, bits: u32, out: &mut Vec<u8>) {
    let r = rice(block, keep);
    let mut stream = Vec::new();
    let mut w = BitWriter { out: &mut stream, acc: 0, n: 0 };
    let mut order: Vec<u32> = Vec::with_capacity(block);
    for chunk in x.chunks(block) {
        let k = keep.min(chunk.len());
        order.clear();
        order.extend(0..chunk.len() as u32);
        // Largest magnitude first; ties by position, so the choice is the same everywhere.
        let by_size = |a: &u32, b: &u32| {
            chunk[*b as usize].abs().total_cmp(&chunk[*a as usize].abs()).then(a.cmp(b))
        };
        if k < chunk.len() {
            order.select_nth_unstable_by(k, by_size);
        }
        let kept = &mut order[..k];
        kept.sort_unstable_by(by_size);
        let mean = |s: &[u32]| {
            let sum: f64 = s.iter().map(|&i| f64::from(chunk[i as usize].abs())).sum();
            if s.is_empty() {
                0.0
            } else {
                (sum / s.len() as f64) as f32
            }
        };
        let (lo, hi) = if bits == 2 {
            // Two levels: the means of the smaller and the larger half (one step of 2-means).
            let (big, small) = kept.split_at(k.div_ceil(2));
            let hi = mean(big);
            (if small.is_empty() { hi } else { mean(small) }, hi)
        } else {
            let m = mean(kept);
            (m, m)
        };
        out.extend_from_slice(&lo.to_le_bytes());
        if bits == 2 {
            out.extend_from_slice(&hi.to_le_bytes());
        }
        kept.sort_unstable();
        let mut next = 0u32;
        for &pos in kept.iter() {
            let v = chunk[pos as usize];
            let gap = (pos - next) as usize;
            w.ones(gap >> r);
            w.put(0, 1);
            w.put(gap as u64, r);
            w.put(u64::from(v < 0.0), 1);
            if bits == 2 {
                let m = v.abs();
                w.put(u64::from((m - lo).abs() > (hi - m).abs()), 1);
            }
            next = pos + 1;
        }
    }
    w.finish();
    out.extend_from_slice(&stream);
}

/// Why a sparse body was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SparseFault {
    /// A level was negative, NaN or infinite.
    BadLevel,
    /// A position beyond its block, a stream that ends early, or bits left over.
    BadStream,
}

/// Inverse of [`encode`]; `body` is the whole raw body (its length is checked here).
pub(crate) fn decode(
    body: &[u8],
    numel: usize,
    block: usize,
    keep: usize,
    bits: u32,
) -> Result<Vec<f32>, SparseFault> {
    let r = rice(block, keep);
    let blocks = numel.div_ceil(block);
    let level_bytes = blocks.checked_mul(4 * levels(bits)).ok_or(SparseFault::BadStream)?;
    if body.len() < level_bytes {
        return Err(SparseFault::BadStream);
    }
    let (level_bytes, stream) = body.split_at(level_bytes);
    let lv: Vec<f32> =
        level_bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    if lv.iter().any(|l| !l.is_finite() || *l < 0.0) {
        return Err(SparseFault::BadLevel);
    }
    let mut out = vec![0.0f32; numel];
    let mut rd = BitReader { bytes: stream, pos: 0 };
    for (b, chunk) in out.chunks_mut(block).enumerate() {
        let (lo, hi) = if bits == 2 { (lv[2 * b], lv[2 * b + 1]) } else { (lv[b], lv[b]) };
        let mut next = 0usize;
        for _ in 0..keep.min(chunk.len()) {
            let mut q = 0usize;
            while rd.bit().ok_or(SparseFault::BadStream)? {
                q += 1;
                if q << r >= chunk.len() {
                    return Err(SparseFault::BadStream);
                }
            }
            let gap = (q << r) | rd.bits(r).ok_or(SparseFault::BadStream)?;
            let pos = next + gap;
            if pos >= chunk.len() {
                return Err(SparseFault::BadStream);
            }
            let neg = rd.bit().ok_or(SparseFault::BadStream)?;
            let high = bits == 2 && rd.bit().ok_or(SparseFault::BadStream)?;
            let m = if high { hi } else { lo };
            chunk[pos] = if neg { -m } else { m };
            next = pos + 1;
        }
    }
    // Exactly the bytes the stream needs, padded with zero bits.
    if rd.pos.div_ceil(8) != stream.len() || rd.bits((8 - rd.pos % 8) as u32 % 8) != Some(0) {
        return Err(SparseFault::BadStream);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
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
            encode(&x, block, keep, bits, &mut body);
            prop_assert!(body.len() <= max_body_len(x.len(), block, keep, bits).unwrap());
            let y = decode(&body, x.len(), block, keep, bits).unwrap();
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

    #[test]
    fn one_bit_sends_signs_at_the_mean_magnitude() {
        let x = [0.1, -4.0, 0.0, 2.0, 0.2, 0.0, 0.0, -0.3];
        let mut body = Vec::new();
        encode(&x, 8, 2, 1, &mut body);
        assert_eq!(
            decode(&body, 8, 8, 2, 1).unwrap(),
            vec![0.0, -3.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0]
        );
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
}
