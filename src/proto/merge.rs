//! The merge of one fragment's round: token weights, RDA (or the weighted mean), and the
//! outer Nesterov step (DESIGN.md §2.3.3–5).
//!
//! Determinism is the point of this file. Contributions are sorted by content hash, every
//! sum runs in that order with f64 accumulators, and nothing here is parallel; the final
//! values are rounded to f32 once. Rust never fuses multiply-adds on its own, so the same
//! previous state and the same set give the same bits on every machine (§3.1.3).

mod agreement;
mod middle;

use super::{MergeRule, PeerId};
use crate::delta::ContentHash;
use crate::fragment::FragmentSpec;
use agreement::agreement;
pub(crate) use agreement::momentum_cosine;

/// One delta as the merge sees it.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub hash: ContentHash,
    /// The peer that made it (bound into the hashed bytes and checked against the signer).
    pub author: PeerId,
    pub tokens: u64,
    pub steps: u64,
    pub values: &'a [f32],
}

/// The robustness bounds of a merge; every peer derives them from the same settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// A contribution's norm per tensor is clipped to `clip ×` the round's median norm.
    pub clip: f64,
    /// No author's total weight may exceed `max_share × the median author's weight`.
    pub max_share: f64,
    /// Fraction of values trimmed at each end per coordinate by [`MergeRule::TrimmedMean`].
    pub trim: f64,
    /// Scale each weight by the contribution's agreement with the round (`agreement`).
    pub agree: bool,
    /// Zeros abstain from the agreement (a sparse delta's zero is a coordinate not sent).
    pub abstain: bool,
}

impl Default for Bounds {
    fn default() -> Self {
        Self { clip: 2.0, max_share: 2.0, trim: 0.2, agree: true, abstain: false }
    }
}

/// What [`combine`] made of a round.
#[derive(Debug, Clone, PartialEq)]
pub struct Combined {
    /// The outer gradient `Δ`.
    pub delta: Vec<f32>,
    /// Each input's agreement factor in `[0, 1]` (all 1 when the bounds do not weigh
    /// by agreement), in input order.
    pub agreement: Vec<f64>,
}

/// `tokens² / steps` (tokens processed × tokens per step): fast and big-batch learners
/// weigh more. A contribution with no tokens gets weight 0. The claims are bounded by the
/// manifest before a delta is accepted; [`author_weights`] caps what remains.
pub fn weight(tokens: u64, steps: u64) -> f64 {
    let t = tokens as f64;
    t * t / steps.max(1) as f64
}

/// Sorts by content hash: the one order every peer can agree on without talking.
pub fn canonical_order(inputs: &mut [Input<'_>]) {
    inputs.sort_by_key(|i| i.hash);
}

/// The median of `v` (lower median for an even count): robust to any minority of outliers
/// on either side, and with two values it trusts the smaller one (a huge value is the
/// dangerous kind). `v` must not be empty.
fn lower_median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

/// Token weights with each author's total capped at `max_share ×` the median author's
/// total. The weight is a claim: claims are bounded by the manifest on arrival, and this cap
/// keeps any one author — however much work it claims — from owning a merge. Computed from
/// the round's own set only, so every peer that merges the same set gets the same weights.
/// All-zero weights fall back to equal weights so a round of token-less deltas still moves.
pub fn author_weights(inputs: &[Input<'_>], max_share: f64) -> Vec<f64> {
    let mut w: Vec<f64> = inputs.iter().map(|i| weight(i.tokens, i.steps)).collect();
    // Group by author (sorted indices: O(n log n) for a thousand-peer round).
    let mut order: Vec<usize> = (0..inputs.len()).collect();
    order.sort_by_key(|&i| (inputs[i].author, i));
    let groups: Vec<&[usize]> =
        order.chunk_by(|&a, &b| inputs[a].author == inputs[b].author).collect();
    let totals: Vec<f64> = groups.iter().map(|g| g.iter().map(|&i| w[i]).sum()).collect();
    if !totals.is_empty() {
        let cap = max_share * lower_median(totals.clone());
        for (g, &total) in groups.iter().zip(&totals) {
            if total > cap && total > 0.0 {
                g.iter().for_each(|&i| w[i] *= cap / total);
            }
        }
    }
    if w.iter().sum::<f64>() <= 0.0 {
        w.iter_mut().for_each(|x| *x = 1.0);
    }
    w
}

/// One tensor's norms and clipping, per contribution (see [`clip_factors`]).
#[derive(Debug, Clone)]
struct Clip {
    /// The tensor's norm.
    norm: Vec<f64>,
    /// What scales its values: `min(1, clip·m / norm)`.
    factor: Vec<f64>,
    /// Its norm clamped into `[m / clip, clip·m]`.
    clamped: Vec<f64>,
}

/// How many distinct authors `inputs` has. What counts as a small set is a matter of
/// authors, not contributions: an author's late deltas of earlier rounds beside its latest
/// are still one voice ([`robust_step`]).
fn authors(inputs: &[Input<'_>]) -> usize {
    agreement::owners(inputs).1
}

/// Per-tensor clipping against the round's own median norm `m` (lower median): returns,
/// per contribution, the factor `min(1, clip·m / norm)` that scales its values, and its norm
/// clamped into `[m / clip, clip·m]` (what RDA's radius averages: a zero or tiny delta
/// claiming a large weight cannot shrink the step below `1/clip` of the median either).
/// Deterministic (same set ⇒ same numbers on every peer) and with no cold start, unlike a
/// norm history kept by each peer.
fn clip_factors(inputs: &[Input<'_>], range: std::ops::Range<usize>, clip: f64) -> Clip {
    let norm: Vec<f64> = inputs.iter().map(|i| norm(&i.values[range.clone()])).collect();
    let median = lower_median(norm.clone());
    // `clip` may be infinite (no clipping): ∞·0 is NaN, which must mean "no bound".
    let hi = if median > 0.0 { clip * median } else { f64::INFINITY };
    let lo = (median / clip).min(hi);
    let factor = norm.iter().map(|&n| if n > hi { hi / n } else { 1.0 }).collect();
    let clamped = norm.iter().map(|&n| n.max(lo).min(hi)).collect();
    Clip { norm, factor, clamped }
}

fn norm(x: &[f32]) -> f64 {
    x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt()
}

/// Combines the deltas (already in canonical order) into the outer gradient `Δ`: weights
/// capped per author, norms clipped per tensor, weights scaled by agreement, then the rule.
pub fn combine(
    spec: &FragmentSpec,
    inputs: &[Input<'_>],
    rule: MergeRule,
    bounds: &Bounds,
) -> Combined {
    combine_along(spec, inputs, rule, bounds, &vec![1.0; inputs.len()])
}

/// [`combine`] with each input's agreement factor capped by `along` (its factor for going
/// the momentum's way, `agreement::momentum_factors`), where the bounds weigh by agreement.
fn combine_along(
    spec: &FragmentSpec,
    inputs: &[Input<'_>],
    rule: MergeRule,
    bounds: &Bounds,
    along: &[f64],
) -> Combined {
    let numel = spec.numel();
    if inputs.is_empty() {
        return Combined { delta: vec![0.0; numel], agreement: Vec::new() };
    }
    let clips: Vec<_> =
        spec.ranges().map(|(_, range)| clip_factors(inputs, range, bounds.clip)).collect();
    let agreement = if bounds.agree {
        let by_round = agreement(spec, inputs, &clips, bounds.abstain);
        by_round.iter().zip(along).map(|(a, m)| a.min(*m)).collect()
    } else {
        vec![1.0; inputs.len()]
    };
    let w: Vec<f64> = author_weights(inputs, bounds.max_share)
        .iter()
        .zip(&agreement)
        .map(|(w, a)| w * a)
        .collect();
    let total: f64 = w.iter().sum();
    let mut out = vec![0f32; numel];
    if total <= 0.0 && rule != MergeRule::TrimmedMean {
        // Nothing agrees with the round: no direction anyone can trust.
        return Combined { delta: out, agreement };
    }
    for ((tensor, range), clip) in spec.ranges().zip(&clips) {
        let merged = match rule {
            MergeRule::TrimmedMean => {
                trimmed_mean(inputs, &clip.factor, bounds.trim, range.clone())
            }
            MergeRule::Mean => weighted_mean(inputs, &w, &clip.factor, total, range.clone()),
            MergeRule::Rda if tensor.is_embedding => {
                weighted_mean(inputs, &w, &clip.factor, total, range.clone())
            }
            MergeRule::Rda => rda(inputs, &w, clip, total, range.clone()),
        };
        out[range].copy_from_slice(&merged);
    }
    Combined { delta: out, agreement }
}

fn weighted_mean(
    inputs: &[Input<'_>],
    w: &[f64],
    clip: &[f64],
    total: f64,
    range: std::ops::Range<usize>,
) -> Vec<f32> {
    let mut acc = vec![0f64; range.len()];
    for ((inp, &wi), &c) in inputs.iter().zip(w).zip(clip) {
        let k = wi * c;
        for (a, &v) in acc.iter_mut().zip(&inp.values[range.clone()]) {
            *a += k * f64::from(v);
        }
    }
    acc.iter().map(|a| (a / total) as f32).collect()
}

/// Coordinate-wise trimmed mean (unweighted): per value, the `⌊trim·n⌋` largest and
/// smallest clipped values are dropped and the rest averaged. Unweighted on purpose: a
/// weight is a claim, and this rule is for swarms where claims are not trusted.
fn trimmed_mean(
    inputs: &[Input<'_>],
    clip: &[f64],
    trim: f64,
    range: std::ops::Range<usize>,
) -> Vec<f32> {
    let n = inputs.len();
    let cut = ((trim * n as f64).floor() as usize).min((n - 1) / 2);
    let mut column = vec![0f64; n];
    range
        .map(|j| {
            for ((c, inp), &k) in column.iter_mut().zip(inputs).zip(clip) {
                *c = k * f64::from(inp.values[j]);
            }
            column.sort_by(f64::total_cmp);
            let kept = &column[cut..n - cut];
            (kept.iter().sum::<f64>() / kept.len() as f64) as f32
        })
        .collect()
}

/// Radial-directional averaging: the weighted mean of the (clamped) norms times the
/// direction of the weighted mean of the unit vectors. Nearly orthogonal deltas keep their
/// typical length instead of shrinking like `1/√M`, so the outer learning rate does not
/// depend on `M`.
fn rda(
    inputs: &[Input<'_>],
    w: &[f64],
    clip: &Clip,
    total: f64,
    range: std::ops::Range<usize>,
) -> Vec<f32> {
    let mut dir = vec![0f64; range.len()];
    let mut norm_acc = 0f64;
    for (((inp, &wi), &clamped_norm), &n) in inputs.iter().zip(w).zip(&clip.clamped).zip(&clip.norm)
    {
        let x = &inp.values[range.clone()];
        norm_acc += wi * clamped_norm;
        if n > 0.0 {
            let k = wi / n;
            for (d, &v) in dir.iter_mut().zip(x) {
                *d += k * f64::from(v);
            }
        }
    }
    let radius = norm_acc / total;
    let dn = dir.iter().map(|d| d * d).sum::<f64>().sqrt();
    if dn == 0.0 {
        return vec![0.0; range.len()];
    }
    dir.iter().map(|d| (radius * d / dn) as f32).collect()
}

/// What [`robust_step`] made of a round.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub anchor: Vec<f32>,
    pub momentum: Vec<f32>,
    /// Contributions dropped because they made the merge non-finite.
    pub dropped: Vec<ContentHash>,
    /// The agreement factor of each input that was merged, in the order `inputs` is left in.
    pub agreement: Vec<f64>,
}

/// The whole merge of a round: contributions pointing against the state's momentum set
/// aside (with agreement weights), [`combine`] over the rest, then the outer step `outer`
/// on copies of the anchor and momentum (the manifest's, or a sampled state's:
/// [`super::sampling::Outer`]). If any resulting value is not finite, the contribution with the largest
/// absolute value (ties: the larger hash) is dropped and the merge is repeated, so a delta
/// that would blow up the anchor costs its own contribution, never the round — and every
/// peer that merges the same set drops the same one. `inputs` keeps what was merged
/// (possibly nothing).
pub fn robust_step(
    spec: &FragmentSpec,
    inputs: &mut Vec<Input<'_>>,
    anchor: &[f32],
    momentum: &[f32],
    settings: &super::Settings,
    outer: super::sampling::Outer,
) -> Step {
    let r = settings.raw();
    let bounds = settings.merge_bounds();
    let mut dropped = Vec::new();
    while !inputs.is_empty() {
        // Held against where the swarm has been going before anything else: what points
        // against the state's momentum earns nothing, and does not vote in the agreement's
        // medians either (where colluders sending one sparse delta would outvote the few
        // honest values of each coordinate they chose).
        let cosines: Vec<Option<f64>> = if bounds.agree {
            inputs.iter().map(|i| agreement::momentum_cosine(spec, i.values, momentum)).collect()
        } else {
            vec![None; inputs.len()]
        };
        let refused: Vec<bool> = cosines.iter().map(|&c| agreement::opposes(c)).collect();
        let heard = only(inputs, |k| !refused[k]);
        let heard_cosines: Vec<Option<f64>> =
            cosines.iter().zip(&refused).filter(|(_, &r)| !r).map(|(&c, _)| c).collect();
        let along = agreement::momentum_factors(&heard_cosines);
        let Combined { mut delta, agreement: weighed } =
            combine_along(spec, &heard, r.merge, &bounds, &along);
        let mut weighed = weighed.into_iter();
        let agreement: Vec<f64> =
            refused.iter().map(|&r| if r { 0.0 } else { weighed.next().unwrap_or(0.0) }).collect();
        // Too few authors for a median: the momentum caps the step too (below).
        let small = bounds.agree && authors(&heard) <= 2;
        if bounds.agree && agreement.iter().all(|&a| a == 0.0) {
            delta.iter_mut().for_each(|v| *v = 0.0);
        } else if small && agreement.iter().filter(|&&a| a > 0.0).count() < heard.len() {
            // Merged again without what the agreement refused.
            let kept = only(inputs, |k| agreement[k] > 0.0);
            delta = combine(spec, &kept, r.merge, &bounds).delta;
        }
        // Sampled contributions each hold `period` rounds of work (`super::sampling`).
        if outer.scale != 1.0 {
            delta.iter_mut().for_each(|v| *v *= outer.scale);
        }
        if small {
            let kept: Vec<&[f32]> = inputs
                .iter()
                .zip(&agreement)
                .filter(|(_, &a)| a > 0.0)
                .map(|(i, _)| i.values)
                .collect();
            cap_to_momentum(spec, &mut delta, momentum, &kept, outer.scale);
        }
        let (mut a, mut m) = (anchor.to_vec(), momentum.to_vec());
        outer_step(&mut a, &mut m, &delta, outer.lr, outer.mu);
        if a.iter().chain(&m).all(|v| v.is_finite()) {
            return Step { anchor: a, momentum: m, dropped, agreement };
        }
        let worst = (0..inputs.len())
            .max_by(|&x, &y| {
                let big = |i: usize| inputs[i].values.iter().fold(0f32, |b, v| b.max(v.abs()));
                big(x).total_cmp(&big(y)).then(inputs[x].hash.cmp(&inputs[y].hash))
            })
            .unwrap_or(0);
        dropped.push(inputs.remove(worst).hash);
    }
    Step { anchor: anchor.to_vec(), momentum: momentum.to_vec(), dropped, agreement: Vec::new() }
}

/// The inputs whose index passes `keep`, in order.
fn only<'a>(inputs: &[Input<'a>], keep: impl Fn(usize) -> bool) -> Vec<Input<'a>> {
    inputs.iter().enumerate().filter(|&(k, _)| keep(k)).map(|(_, i)| *i).collect()
}

/// With fewer than three authors the round's median norm may be one author's, so the
/// clip bounds nothing: a lone −10× copy of an honest delta, at an angle to the momentum
/// that the sign test lets through, would move the anchor ten rounds' worth (measured on
/// real processes: val_bpb 5.96 against 4.08, when honest peers had left and the copy
/// merged alone). The state's momentum is the reference instead: each tensor of the
/// merged delta is scaled down to at most the momentum's norm of that tensor, which an
/// honest delta rarely exceeds (with μ = 0.9 the buffer holds about 2.3 times a delta's
/// norm when deltas are uncorrelated, 10 times when aligned). Where a tensor's momentum is
/// still zero (a fragment's first merges) the smaller of the `kept` inputs' norms of that
/// tensor (times the outer `scale`) is the cap: a −10× copy merged beside an honest delta
/// moves the anchor no further than the honest one would (a real-process run of
/// tests/hostile.rs ended at val_bpb 4.43 against 3.78 clean through that opening). A lone
/// input is its own reference: nothing is capped before the momentum exists.
fn cap_to_momentum(
    spec: &FragmentSpec,
    delta: &mut [f32],
    momentum: &[f32],
    kept: &[&[f32]],
    scale: f32,
) {
    for (_, range) in spec.ranges() {
        let mut cap = norm(&momentum[range.clone()]);
        if cap == 0.0 {
            let smallest = kept.iter().map(|v| norm(&v[range.clone()])).filter(|&n| n > 0.0);
            cap = smallest.fold(f64::INFINITY, f64::min) * f64::from(scale.abs());
        }
        let d = norm(&delta[range.clone()]);
        if cap > 0.0 && cap.is_finite() && d > cap {
            let k = (cap / d) as f32;
            delta[range].iter_mut().for_each(|v| *v *= k);
        }
    }
}

/// Outer SGD with Nesterov momentum: `buf ← μ·buf + Δ; anchor ← anchor − lr·(Δ + μ·buf)`.
pub fn outer_step(anchor: &mut [f32], momentum: &mut [f32], delta: &[f32], lr: f32, mu: f32) {
    for ((a, m), &d) in anchor.iter_mut().zip(momentum.iter_mut()).zip(delta) {
        *m = mu * *m + d;
        *a -= lr * (d + mu * *m);
    }
}

/// Consensus distance: mean over peers of `‖anchor_i − mean‖ / ‖mean‖` (0 = agreement).
/// The mean is taken in peer order with f64 accumulators. Returns 0 for fewer than 2 peers.
pub fn consensus_distance(anchors: &[&[f32]]) -> f64 {
    let Some(first) = anchors.first() else { return 0.0 };
    if anchors.len() < 2 {
        return 0.0;
    }
    let n = first.len();
    let mut mean = vec![0f64; n];
    for a in anchors {
        for (m, &v) in mean.iter_mut().zip(a.iter()) {
            *m += f64::from(v);
        }
    }
    mean.iter_mut().for_each(|m| *m /= anchors.len() as f64);
    let mean_norm = mean.iter().map(|m| m * m).sum::<f64>().sqrt().max(1e-30);
    let spread: f64 = anchors
        .iter()
        .map(|a| a.iter().zip(&mean).map(|(&v, m)| (f64::from(v) - m).powi(2)).sum::<f64>().sqrt())
        .sum();
    spread / anchors.len() as f64 / mean_norm
}

#[cfg(test)]
mod tests;
