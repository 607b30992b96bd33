//! Blockwise symmetric quantisation with one f32 scale per block.
//!
//! Why symmetric and per block: outer deltas are centred on zero with heavy-ish tails; a
//! per-block absmax scale keeps one outlier from flattening a whole tensor, and symmetric
//! codes need no zero point. Dequantisation is `code as f32 * scale`, a single IEEE
//! multiplication, so every peer turns the same bytes into the same floats bit for bit —
//! the merge's determinism rests on that.

/// Number of quantisation levels on each side of zero.
pub(crate) const fn max_code(bits: u32) -> i32 {
    (1 << (bits - 1)) - 1
}

/// Body bytes for `numel` values in blocks of `block` at `bits` per value:
/// the scales first, then the packed codes.
pub(crate) fn body_len(numel: usize, block: usize, bits: u32) -> Option<usize> {
    let blocks = numel.div_ceil(block);
    let codes = match bits {
        8 => numel,
        4 => numel.div_ceil(2),
        _ => return None,
    };
    blocks.checked_mul(4)?.checked_add(codes)
}

/// Quantises `x` and writes scales then codes into `out`; returns nothing, the caller
/// dequantises the same bytes to get the error-feedback residual.
pub(crate) fn quantise(x: &[f32], block: usize, bits: u32, out: &mut Vec<u8>) {
    let qmax = max_code(bits) as f32;
    let mut scales = Vec::with_capacity(x.len().div_ceil(block));
    for chunk in x.chunks(block) {
        let absmax = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        scales.push(if absmax > 0.0 { absmax / qmax } else { 0.0 });
    }
    for s in &scales {
        out.extend_from_slice(&s.to_le_bytes());
    }
    let code = |v: f32, s: f32| -> i32 {
        if s == 0.0 {
            0
        } else {
            ((v / s).round() as i32).clamp(-(qmax as i32), qmax as i32)
        }
    };
    match bits {
        8 => {
            for (chunk, &s) in x.chunks(block).zip(&scales) {
                out.extend(chunk.iter().map(|&v| code(v, s) as i8 as u8));
            }
        }
        _ => {
            // Two codes per byte, low nibble first, each stored as code + 8 in 1..=15.
            let codes: Vec<u8> = x
                .chunks(block)
                .zip(&scales)
                .flat_map(|(chunk, &s)| chunk.iter().map(move |&v| (code(v, s) + 8) as u8))
                .collect();
            out.extend(codes.chunks(2).map(|p| p[0] | (p.get(1).copied().unwrap_or(8) << 4)));
        }
    }
}

/// Why dequantisation refused a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyFault {
    /// A scale was negative, NaN or infinite.
    BadScale,
    /// A 4-bit code used the reserved value 0 (only 1..=15 are written).
    BadCode,
}

/// Inverse of [`quantise`]. The caller has already checked `body.len()` with [`body_len`].
pub(crate) fn dequantise(
    body: &[u8],
    numel: usize,
    block: usize,
    bits: u32,
) -> Result<Vec<f32>, BodyFault> {
    let blocks = numel.div_ceil(block);
    let (scale_bytes, codes) = body.split_at(blocks * 4);
    let scales: Vec<f32> =
        scale_bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    if scales.iter().any(|s| !s.is_finite() || *s < 0.0) {
        return Err(BodyFault::BadScale);
    }
    let mut out = Vec::with_capacity(numel);
    match bits {
        8 => out
            .extend(codes.iter().enumerate().map(|(i, &c)| f32::from(c as i8) * scales[i / block])),
        _ => {
            for i in 0..numel {
                let byte = codes[i / 2];
                let nib = if i % 2 == 0 { byte & 0x0f } else { byte >> 4 };
                if nib == 0 {
                    return Err(BodyFault::BadCode);
                }
                out.push(f32::from(nib as i8 - 8) * scales[i / block]);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Each value comes back within half a quantisation step of its block's scale.
        #[test]
        fn error_is_within_half_a_step(
            x in prop::collection::vec(-1e3f32..1e3, 1..300),
            block in 1usize..70,
            four in any::<bool>(),
        ) {
            let bits = if four { 4 } else { 8 };
            let mut body = Vec::new();
            quantise(&x, block, bits, &mut body);
            prop_assert_eq!(Some(body.len()), body_len(x.len(), block, bits));
            let y = dequantise(&body, x.len(), block, bits).unwrap();
            for (bx, by) in x.chunks(block).zip(y.chunks(block)) {
                let absmax = bx.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let step = absmax / max_code(bits) as f32;
                for (a, b) in bx.iter().zip(by) {
                    // Half a step, plus the f32 rounding of `code × scale` at the value's
                    // magnitude (a few ulps; near 1e3 that exceeds 1e-5 of a small step).
                    let ulps = 4.0 * f32::EPSILON * a.abs().max(b.abs());
                    prop_assert!((a - b).abs() <= step * 0.5 * (1.0 + 1e-5) + ulps + 1e-30,
                        "{a} vs {b}, step {step}");
                }
            }
        }
    }

    #[test]
    fn zero_block_and_bad_scale() {
        let mut body = Vec::new();
        quantise(&[0.0; 5], 4, 4, &mut body);
        assert_eq!(dequantise(&body, 5, 4, 4).unwrap(), vec![0.0; 5]);
        body[0..4].copy_from_slice(&f32::NAN.to_le_bytes());
        assert_eq!(dequantise(&body, 5, 4, 4), Err(BodyFault::BadScale));
    }
}
