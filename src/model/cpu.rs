//! What atoll's CPU kernels (GELU, attention weights, layer norm) share: contiguous f32
//! views of Flex tensors, the run-time choice of vector width, and sums in a fixed order.

use burn::backend::flex::FlexTensor;
use burn::tensor::DType;

/// Values per rayon task: large enough that splitting a small tensor costs nothing (row
/// kernels round it to whole rows).
pub(super) const CHUNK: usize = 1 << 14;

/// Runs `f` compiled for the widest vector instructions this CPU has (AVX-512, AVX2 or the
/// baseline, chosen at run time): `f`'s loops, inlined into it, vectorise at that width
/// where the compiler vectorises at all (optimised builds). Same results on every width:
/// the kernels' arithmetic is elementwise, or summed in a fixed order of lanes.
#[inline(always)]
pub(super) fn vectorised<R>(f: impl FnOnce() -> R) -> R {
    pulp::Arch::new().dispatch(f)
}

/// `t` as contiguous f32 values (copied into order if it was a view), or `Err(t)` for
/// another dtype.
pub(super) fn f32_values(t: FlexTensor) -> Result<FlexTensor, FlexTensor> {
    if t.dtype() != DType::F32 {
        return Err(t);
    }
    if t.layout().is_contiguous() {
        return Ok(t);
    }
    let t = t.to_contiguous();
    if t.layout().is_contiguous() {
        Ok(t)
    } else {
        Err(t)
    }
}

/// Lanes of the sums below: eight partial sums, added in a fixed order, so a sum does not
/// depend on the vector width or the thread count.
pub(super) const LANES: usize = 8;

/// `Σ x`.
#[inline(always)]
pub(super) fn sum(xs: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        lanes.iter_mut().zip(c).for_each(|(l, &x)| *l += x);
    }
    lanes.iter().sum::<f32>() + rest
}

/// `Σ a · b`.
#[inline(always)]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let rest: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(a, b)| a * b).sum();
    for (a, b) in ca.zip(cb) {
        lanes.iter_mut().zip(a.iter().zip(b)).for_each(|(l, (a, b))| *l += a * b);
    }
    lanes.iter().sum::<f32>() + rest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lane_sums_add_every_value() {
        for len in [0usize, 1, 7, 8, 9, 17, 64] {
            let xs: Vec<f32> = (0..len).map(|i| i as f32 + 0.5).collect();
            let want: f32 = xs.iter().sum();
            assert_eq!(sum(&xs), want, "len {len}");
            let ys: Vec<f32> = (0..len).map(|i| (i % 3) as f32).collect();
            let want: f32 = xs.iter().zip(&ys).map(|(a, b)| a * b).sum();
            assert_eq!(dot(&xs, &ys), want, "len {len}");
        }
    }
}
