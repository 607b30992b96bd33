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
    /// Bits read so far.
    pos: usize,
}

impl BitReader<'_> {
    /// At least the next 57 bits from `pos` (least significant first), zero past the end.
    fn peek(&self) -> u64 {
        let i = self.pos / 8;
        let word = match self.bytes.get(i..i + 8).map(<[u8; 8]>::try_from) {
            Some(Ok(w)) => w,
            _ => {
                let rest = self.bytes.get(i..).unwrap_or(&[]);
                let mut w = [0u8; 8];
                w[..rest.len().min(8)].copy_from_slice(&rest[..rest.len().min(8)]);
                w
            }
        };
        u64::from_le_bytes(word) >> (self.pos % 8)
    }

    /// One kept value's code: its gap (Rice, parameter `r`), sign and, for `two` levels,
    /// whether it is the high one. `None` when the stream ends or the gap's quotient
    /// reaches `limit`. One read of the stream when the code fits in it.
    fn value(
        &mut self,
        r: u32,
        two: bool,
        limit: impl Fn(usize) -> bool,
    ) -> Option<(usize, bool, bool)> {
        let w = self.peek();
        let t = w.trailing_ones() as usize;
        let need = t + r as usize + 2 + usize::from(two);
        if need <= 57 && self.pos + need <= self.bytes.len() * 8 {
            if limit(t) {
                return None;
            }
            let rest = w >> (t + 1);
            let gap = (t << r) | (rest & ((1u64 << r) - 1)) as usize;
            let neg = (rest >> r) & 1 == 1;
            let high = two && (rest >> (r + 1)) & 1 == 1;
            self.pos += need;
            return Some((gap, neg, high));
        }
        let q = self.ones(limit)?;
        let gap = (q << r) | self.bits(r)?;
        let neg = self.bit()?;
        let high = two && self.bit()?;
        Some((gap, neg, high))
    }

    /// The next `n` (≤ 32) bits, or `None` past the end.
    fn bits(&mut self, n: u32) -> Option<usize> {
        if self.pos + n as usize > self.bytes.len() * 8 {
            return None;
        }
        let v = self.peek() & ((1u64 << n) - 1);
        self.pos += n as usize;
        Some(v as usize)
    }

    fn bit(&mut self) -> Option<bool> {
        self.bits(1).map(|b| b == 1)
    }

    /// A unary count: the ones before the next zero (consumed too). `None` when the stream
    /// ends first or the count reaches `limit` (checked as it grows, so a long run of ones
    /// is refused in steps of 57 bits, not read to its end).
    fn ones(&mut self, limit: impl Fn(usize) -> bool) -> Option<usize> {
        let mut q = 0usize;
        loop {
            let t = self.peek().trailing_ones() as usize;
            if t < 57 {
                // The zero ending the run must lie within the stream, not in the padding.
                if self.pos + t >= self.bytes.len() * 8 || limit(q + t) {
                    return None;
                }
                self.pos += t + 1;
                return Some(q + t);
            }
            q += 57;
            self.pos += 57;
            if limit(q) {
                return None;
            }
        }
    }
}

/// Encodes `x` into `out` (levels, then the bit stream) and returns what [`decode`] reads
/// from those bytes: each kept value is its block's stored level or its negation, the rest
/// zero, so the sender's residual is the receivers' view without decoding its own body.
/// `x` is finite (the caller checks).
pub(crate) fn encode(
    x: &[f32],
    block: usize,
    keep: usize,
    bits: u32,
    out: &mut Vec<u8>,
) -> Vec<f32> {
    let r = rice(block, keep);
    let mut values = vec![0.0f32; x.len()];
    let mut stream = Vec::new();
    let mut w = BitWriter { out: &mut stream, acc: 0, n: 0 };
    let mut keys: Vec<u64> = Vec::with_capacity(block);
    let mut kept_pos: Vec<u32> = Vec::with_capacity(keep.min(block));
    // Largest magnitude first, ties by position, so the choice is the same everywhere: one
    // integer key orders both (a finite magnitude orders as its bits; the position is
    // inverted so that a smaller one ranks higher). Plain integer selection, no comparator
    // reaching back into the block.
    let descending = |a: &u64, b: &u64| b.cmp(a);
    for (chunk, sent) in x.chunks(block).zip(values.chunks_mut(block)) {
        let k = keep.min(chunk.len());
        keys.clear();
        keys.extend(
            chunk
                .iter()
                .enumerate()
                .map(|(i, v)| u64::from(v.abs().to_bits()) << 32 | u64::from(!(i as u32))),
        );
        if k < chunk.len() {
            keys.select_nth_unstable_by(k, descending);
        }
        let kept = &mut keys[..k];
        let value = |key: u64| chunk[!(key as u32) as usize];
        let mean = |s: &[u64]| {
            let sum: f64 = s.iter().map(|&key| f64::from(value(key).abs())).sum();
            if s.is_empty() {
                0.0
            } else {
                (sum / s.len() as f64) as f32
            }
        };
        let (lo, hi) = if bits == 2 {
            // Two levels: the means of the smaller and the larger half (one step of 2-means).
            let half = k.div_ceil(2);
            if half < k {
                kept.select_nth_unstable_by(half, descending);
            }
            let (big, small) = kept.split_at(half);
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
        kept_pos.clear();
        kept_pos.extend(kept.iter().map(|&key| !(key as u32)));
        kept_pos.sort_unstable();
        let mut next = 0u32;
        for &pos in &kept_pos {
            let v = chunk[pos as usize];
            let gap = (pos - next) as usize;
            w.ones(gap >> r);
            w.put(0, 1);
            w.put(gap as u64, r);
            w.put(u64::from(v < 0.0), 1);
            let mut level = lo;
            if bits == 2 {
                let m = v.abs();
                let high = (m - lo).abs() > (hi - m).abs();
                w.put(u64::from(high), 1);
                if high {
                    level = hi;
                }
            }
            sent[pos as usize] = if v < 0.0 { -level } else { level };
            next = pos + 1;
        }
    }
    w.finish();
    out.extend_from_slice(&stream);
    values
}

/// Why a sparse body was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SparseFault {
    /// A level was negative, NaN or infinite.
    BadLevel,
    /// A position beyond its block, a stream that ends early, or bits left over.
    BadStream,
}

/// A body's per-block levels (checked: finite, not negative) and the bit stream after them.
fn split_levels(
    body: &[u8],
    numel: usize,
    block: usize,
    bits: u32,
) -> Result<(Vec<f32>, &[u8]), SparseFault> {
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
    Ok((lv, stream))
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
    let (lv, stream) = split_levels(body, numel, block, bits)?;
    let mut out = vec![0.0f32; numel];
    let mut rd = BitReader { bytes: stream, pos: 0 };
    for (b, chunk) in out.chunks_mut(block).enumerate() {
        let (lo, hi) = if bits == 2 { (lv[2 * b], lv[2 * b + 1]) } else { (lv[b], lv[b]) };
        let mut next = 0usize;
        for _ in 0..keep.min(chunk.len()) {
            let (gap, neg, high) =
                rd.value(r, bits == 2, |q| q << r >= chunk.len()).ok_or(SparseFault::BadStream)?;
            let pos = next + gap;
            if pos >= chunk.len() {
                return Err(SparseFault::BadStream);
            }
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
mod tests;
