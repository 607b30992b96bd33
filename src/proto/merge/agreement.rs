//! How far each contribution of a round goes the round's way: the factor that scales its
//! weight in the merge (`Bounds::agree`), from directions only, bit-identical on every peer.

use super::{lower_median, middle, norm, Clip, Input};
use crate::fragment::FragmentSpec;

/// A contribution whose cosine with the median of the *other* contributions' directions
/// is below `−OPPOSED` earns nothing, whatever its score against the whole round.
const OPPOSED: f64 = 0.25;

/// Coordinates whose columns are gathered at a time.
const BLOCK: usize = 64;

/// How far each contribution goes the round's way, as a weight factor in `[0, 1]`.
///
/// The reference is the coordinate-wise median of the contributions' directions (each
/// tensor scaled to unit norm; the mean of the two middle values for an even count): a
/// minority cannot move any coordinate of it past an honest value, and no norm can drag
/// it. A contribution's score is the cosine between its directions and that reference
/// (each concatenated over the fragment's tensors), and its factor is twice its score over
/// the round's median score, clamped to `[0, 1]`: honest contributions (at least half as
/// aligned as the median) keep their whole weight, so an honest swarm merges as before,
/// while a zero, reversed or random delta earns nothing, and a delta that copies the
/// reference weighs no more than the median contributor.
///
/// In a small set one vote moves the median a long way, so each contribution is also held
/// against the others alone (the median without it), and one the others clearly point
/// against (cosine below `−OPPOSED`) earns nothing. Without that, a −10× copy of one
/// honest delta beside two honest ones that happened to point slightly apart scored as
/// well as its victim and took the merge (measured on real processes: val_bpb 6.3 against
/// 3.7). The threshold sits below zero because in a large, noisy set an honest delta's
/// cosine with the others hovers near zero. Two contributions pointing apart (negative
/// cosine) both earn nothing: either may be the poisoned one and no median can tell.
///
/// With a sparse codec (`abstain`) a zero is a coordinate the contribution did not send,
/// not a vote for zero: the medians are over the values that were sent, and the score is
/// the cosine with the *others'* median (a coordinate only one contribution sent would
/// otherwise make it its own reference). While zeros voted, a round of top-k deltas had a
/// median of zero almost everywhere: the simulator's honest sparse swarms skipped over half
/// their rounds for want of weight, and a quarter of colluding attackers cost 1.6–2.1×
/// (bench/RESULTS.md, "Sparse deltas: zeros abstain").
///
/// Scores are relative to the round's own set, computed in f64 in canonical order: every
/// peer that merges the same set gets the same bits. Measured (tests/simulator/byzantine.rs,
/// SECURITY.md): costs an honest swarm nothing; a quarter of colluding peers sending
/// reversed or aimed deltas cost at most 5%, against 1.25–6.3× without it.
pub(super) fn agreement(
    spec: &FragmentSpec,
    inputs: &[Input<'_>],
    clips: &[Clip],
    abstain: bool,
) -> Vec<f64> {
    let n = inputs.len();
    if n < 2 {
        return vec![1.0; n];
    }
    let (owner, authors) = owners(inputs);
    if authors < n && !abstain {
        return by_author(spec, inputs, clips, &owner, authors);
    }
    // Per contribution, against the whole round's median and against the others' median:
    // the dot with the reference and the reference's squared norm; and its own.
    let mut sums = Sums::new(n);
    let mut block = vec![0f64; BLOCK * n];
    let mut keys = vec![0i64; n];
    // Only the middle of each column counts (`middle`): over every value, or with
    // `abstain` over the non-zero ones.
    let (mut spill, mut others) = (Vec::new(), vec![0f64; n]);
    let mut votes = middle::Votes::default();
    for ((_, range), clip) in spec.ranges().zip(clips) {
        // Directions only: each contribution's tensor scaled to unit norm.
        let unit: Vec<f64> =
            clip.norm.iter().map(|&n| if n > 0.0 { 1.0 / n } else { 0.0 }).collect();
        for from in range.clone().step_by(BLOCK) {
            let len = BLOCK.min(range.end - from);
            // Each contribution's stretch of the block in turn (sequential reads), into
            // rows by coordinate: a coordinate's column is then one row.
            for (i, (inp, &k)) in inputs.iter().zip(&unit).enumerate() {
                for (t, &v) in inp.values[from..from + len].iter().enumerate() {
                    block[t * n + i] = k * f64::from(v);
                }
            }
            for column in block[..len * n].chunks_exact(n) {
                for (key, &c) in keys.iter_mut().zip(column) {
                    *key = total_key(c);
                }
                let r = if abstain {
                    middle::medians_of_votes(&keys, &mut votes, &mut spill, &mut others)
                } else {
                    let mid = middle::middle_keys(&keys, &mut spill);
                    middle::medians(&keys, mid, &mut others)
                };
                sums.ref_sq += r * r;
                for i in 0..n {
                    sums.add(i, column[i], r, others[i]);
                }
            }
        }
    }
    let with_others = sums.with_others();
    // A pair: each one's "others" is the other one.
    if n == 2 && with_others[0] < 0.0 {
        return vec![0.0; 2];
    }
    let score: Vec<f64> = if abstain { with_others.clone() } else { sums.with_reference() };
    factors(&score, &with_others)
}

/// Per contribution, over every coordinate: its dot with the round's reference (the
/// median) and with the median of the others, their squared norms and its own.
struct Sums {
    dot: Vec<f64>,
    ref_sq: f64,
    dot_others: Vec<f64>,
    others_sq: Vec<f64>,
    sq: Vec<f64>,
}

impl Sums {
    fn new(n: usize) -> Self {
        let zeros = vec![0f64; n];
        Self {
            dot: zeros.clone(),
            ref_sq: 0.0,
            dot_others: zeros.clone(),
            others_sq: zeros.clone(),
            sq: zeros,
        }
    }

    /// Contribution `i`'s value `c` at a coordinate where the reference is `r` and the
    /// others' median `o`.
    fn add(&mut self, i: usize, c: f64, r: f64, o: f64) {
        self.sq[i] += c * c;
        self.dot[i] += c * r;
        self.dot_others[i] += c * o;
        self.others_sq[i] += o * o;
    }

    /// Each contribution's cosine with the others' median.
    fn with_others(&self) -> Vec<f64> {
        (0..self.sq.len())
            .map(|i| cosine(self.dot_others[i], self.sq[i], self.others_sq[i]))
            .collect()
    }

    /// Each contribution's cosine with the round's reference.
    fn with_reference(&self) -> Vec<f64> {
        (0..self.sq.len()).map(|i| cosine(self.dot[i], self.sq[i], self.ref_sq)).collect()
    }
}

/// The cosine from a dot product and two squared norms (0 where either is 0).
fn cosine(dot: f64, a: f64, b: f64) -> f64 {
    if a > 0.0 && b > 0.0 {
        dot / (a.sqrt() * b.sqrt())
    } else {
        0.0
    }
}

/// Each input's author as an index into the round's distinct authors (in id order), and
/// how many there are.
pub(super) fn owners(inputs: &[Input<'_>]) -> (Vec<usize>, usize) {
    let mut ids: Vec<_> = inputs.iter().map(|i| i.author).collect();
    ids.sort_unstable();
    ids.dedup();
    let owner = inputs.iter().map(|i| ids.binary_search(&i.author).unwrap_or(0)).collect();
    (owner, ids.len())
}

/// [`agreement`] for a set of dense deltas where some author has several contributions
/// (late deltas of earlier rounds beside its latest): one author, one vote. Each author's
/// value at a coordinate is the mean of its contributions'; the medians are over authors,
/// and a contribution's "others" are the other authors; two authors pointing apart are a
/// pair. (Sparse deltas keep counting contributions: grouping them left the simulator's
/// sparse swarm under attack holding several states for a whole period, seed 79.)
/// Counting contributions instead let one attacker with three late −10× copies in a set
/// outvote the one honest delta beside them and take the whole merge, once the other
/// honest peers had finished training (tests/hostile.rs, author-bound attacker: val_bpb
/// 7.02 against 3.80 in one CI run, 6.77 in one of four local runs).
fn by_author(
    spec: &FragmentSpec,
    inputs: &[Input<'_>],
    clips: &[Clip],
    owner: &[usize],
    authors: usize,
) -> Vec<f64> {
    let n = inputs.len();
    let mut sums = Sums::new(n);
    let mut column = vec![0f64; n];
    let (mut sum, mut count) = (vec![0f64; authors], vec![0u32; authors]);
    let (mut votes, mut spill) = (vec![0i64; authors], Vec::new());
    let mut others = vec![0f64; authors];
    for ((_, range), clip) in spec.ranges().zip(clips) {
        let unit: Vec<f64> =
            clip.norm.iter().map(|&n| if n > 0.0 { 1.0 / n } else { 0.0 }).collect();
        for j in range {
            sum.iter_mut().for_each(|s| *s = 0.0);
            count.iter_mut().for_each(|c| *c = 0);
            for (i, (c, inp)) in column.iter_mut().zip(inputs).enumerate() {
                *c = unit[i] * f64::from(inp.values[j]);
                sum[owner[i]] += *c;
                count[owner[i]] += 1;
            }
            // Each author's vote, and the medians over authors (`middle`).
            for ((v, &s), &k) in votes.iter_mut().zip(&sum).zip(&count) {
                *v = total_key(s / f64::from(k.max(1)));
            }
            let r = if authors >= 2 {
                let mid = middle::middle_keys(&votes, &mut spill);
                middle::medians(&votes, mid, &mut others)
            } else {
                others[0] = 0.0;
                sum[0] / f64::from(count[0].max(1))
            };
            sums.ref_sq += r * r;
            for i in 0..n {
                let (c, o) = (column[i], others[owner[i]]);
                sums.add(i, c, r, o);
            }
        }
    }
    let with_others = sums.with_others();
    // Two authors, as a pair above: each one's "others" is the other one.
    if authors == 2 && with_others.iter().any(|&o| o < 0.0) {
        return vec![0.0; n];
    }
    let score = sums.with_reference();
    factors(&score, &with_others)
}

/// Each contribution's weight factor from its score against the round and its cosine with
/// the others: twice its score over the round's median score, clamped to `[0, 1]`; nothing
/// where the others clearly point against it.
fn factors(score: &[f64], with_others: &[f64]) -> Vec<f64> {
    let typical = lower_median(score.to_vec());
    score
        .iter()
        .zip(with_others)
        .map(|(&s, &o)| {
            if o < -OPPOSED {
                0.0
            } else if typical > 0.0 {
                (2.0 * s / typical).clamp(0.0, 1.0)
            } else {
                f64::from(u8::from(s > 0.0))
            }
        })
        .collect()
}

/// Sets `rank[i]` to the position of `keys[i]` in ascending order (ties by index): the
/// ranked column that the medians of `middle` reproduce without ranking (tests only).
#[cfg(test)]
pub(super) fn ranks(keys: &[i64], order: &mut Vec<(i64, u32)>, rank: &mut [usize]) {
    order.clear();
    order.extend(keys.iter().enumerate().map(|(i, &k)| (k, i as u32)));
    order.sort_unstable();
    for (k, &(_, i)) in order.iter().enumerate() {
        rank[i as usize] = k;
    }
}

/// An integer that orders as [`f64::total_cmp`] orders `v` (its definition: the sign bit
/// flips the others), so a column is sorted as integers, branch-free (`middle`).
pub(super) fn total_key(v: f64) -> i64 {
    let bits = v.to_bits() as i64;
    bits ^ (((bits >> 63) as u64) >> 1) as i64
}

/// The median of the ascending, non-empty `sorted` (the mean of the two middle values for
/// an even count).
#[cfg(test)]
pub(super) fn median_of_sorted(sorted: &[f64]) -> f64 {
    let m = sorted.len();
    if m % 2 == 1 {
        sorted[m / 2]
    } else {
        0.5 * (sorted[m / 2 - 1] + sorted[m / 2])
    }
}

/// The median of the ascending `sorted` without its element at `skip` (the mean of the
/// two middle values for an even count). `sorted` holds at least two values.
#[cfg(test)]
pub(super) fn median_without(sorted: &[f64], skip: usize) -> f64 {
    let m = sorted.len() - 1;
    let at = |p: usize| sorted[if p < skip { p } else { p + 1 }];
    if m % 2 == 1 {
        at(m / 2)
    } else {
        0.5 * (at(m / 2 - 1) + at(m / 2))
    }
}

/// The cosine of `values` with `momentum` (per-tensor unit directions, concatenated over
/// the fragment's tensors); `None` where no tensor has both non-zero (nothing merged yet).
/// The state's momentum — where the swarm has been going, the same on every peer that
/// merges from the same state — is a witness no contributor of the round can move: in a
/// set too small for a median the only one, and in any set the one colluders cannot
/// outvote.
pub(crate) fn momentum_cosine(
    spec: &FragmentSpec,
    values: &[f32],
    momentum: &[f32],
) -> Option<f64> {
    // Each tensor with both directions non-zero is a unit vector on either side, so the
    // cosine of the concatenations is the sum of the per-tensor cosines over their count.
    let (mut dot, mut tensors) = (0f64, 0u32);
    for (_, range) in spec.ranges() {
        let (v, m) = (&values[range.clone()], &momentum[range]);
        let (nv, nm) = (norm(v), norm(m));
        if nv == 0.0 || nm == 0.0 {
            continue;
        }
        for (&a, &b) in v.iter().zip(m) {
            dot += f64::from(a) / nv * f64::from(b) / nm;
        }
        tensors += 1;
    }
    // Finite values can still square past f64's range; such a cosine says nothing.
    Some(dot / f64::from(tensors)).filter(|c| tensors > 0 && c.is_finite())
}

/// Whether a contribution of momentum cosine `cosine` points clearly against the momentum
/// (below `−OPPOSED`): it earns nothing and does not vote in the agreement's medians
/// (`robust_step` sets it aside first).
pub(super) fn opposes(cosine: Option<f64>) -> bool {
    cosine.is_some_and(|c| c < -OPPOSED)
}

/// Each contribution's factor for going the momentum's way as far as the round does: twice
/// its momentum cosine over the round's median one, clamped to `[0, 1]` — the agreement's
/// rule, with the momentum as the reference. Honest deltas go the momentum's way alike and
/// keep their whole weight (in the default model's demo the lowest of 1,923 cosines was
/// 0.48 of their median, and every merged contribution kept its weight: bench/RESULTS.md,
/// "Held to the momentum's share"); a delta with the momentum taken out (the oblique
/// attack, which the agreement scores well when colluders share it) earns nothing, and one
/// that adds just enough momentum to pass must go at least half as far the swarm's way as
/// its round (the aligned attack does: SECURITY.md).
/// All 1 where the median is not positive, or fewer than three contributions have a cosine
/// (too few for a median that one vote cannot move).
pub(super) fn momentum_factors(cosines: &[Option<f64>]) -> Vec<f64> {
    let known: Vec<f64> = cosines.iter().flatten().copied().collect();
    if known.len() < 3 {
        return vec![1.0; cosines.len()];
    }
    let median = lower_median(known);
    if median <= 0.0 {
        return vec![1.0; cosines.len()];
    }
    cosines.iter().map(|c| c.map_or(1.0, |c| (2.0 * c / median).clamp(0.0, 1.0))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn momentum_factors_follow_the_rounds_median() {
        // Lower median of [0, 0.3, 0.8, 0.9] is 0.3: twice it and more keep everything.
        let f = momentum_factors(&[Some(0.8), Some(0.9), Some(0.3), Some(0.0), None]);
        assert_eq!(f, vec![1.0, 1.0, 1.0, 0.0, 1.0]);
        let f = momentum_factors(&[Some(0.8), Some(0.9), Some(0.85), Some(0.2)]);
        assert_eq!(f, vec![1.0, 1.0, 1.0, 0.5]);
        // Too few cosines for a median one vote cannot move, or a median not positive.
        assert_eq!(momentum_factors(&[Some(0.9), Some(0.0), None]), vec![1.0; 3]);
        assert_eq!(momentum_factors(&[Some(-0.1), Some(0.0), Some(0.5)]), vec![1.0; 3]);
    }

    /// The sort key orders exactly as `total_cmp`: signed zeros, infinities, NaNs of both
    /// signs, subnormals and ordinary values.
    #[test]
    fn total_key_orders_as_total_cmp() {
        let mut values = vec![
            0.0,
            -0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -f64::NAN,
            f64::MIN_POSITIVE,
            -f64::MIN_POSITIVE,
            f64::MIN_POSITIVE / 4.0,
            -f64::MIN_POSITIVE / 4.0,
            f64::MAX,
            f64::MIN,
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(f64::from_bits(x));
            values.push((x % 2001) as f64 / 1000.0 - 1.0);
        }
        for a in &values {
            for b in &values {
                assert_eq!(total_key(*a).cmp(&total_key(*b)), a.total_cmp(b), "{a:e} {b:e}");
            }
        }
        // Ranks of the keys order as `total_cmp` does, ties by index.
        for n in [2, 3, 8, 17, 32, 33, 64] {
            for start in [0, 5, 100] {
                let column: Vec<f64> = values[start..start + n]
                    .iter()
                    .enumerate()
                    .map(|(i, v)| if i % 5 == 4 { 0.5 } else { *v })
                    .collect();
                let keys: Vec<i64> = column.iter().map(|v| total_key(*v)).collect();
                let mut rank = vec![0; n];
                ranks(&keys, &mut Vec::new(), &mut rank);
                let mut order: Vec<usize> = (0..n).collect();
                order.sort_by(|&a, &b| column[a].total_cmp(&column[b]).then(a.cmp(&b)));
                let mut want = vec![0; n];
                for (k, &i) in order.iter().enumerate() {
                    want[i] = k;
                }
                assert_eq!(rank, want, "n {n} from {start}");
            }
        }
    }
}
