//! The middle of one coordinate's column: the round's median and each contribution's
//! median of the *others*, from the column's two or three middle values alone.
//!
//! Removing one value from a sorted column moves its median by at most one place, so a
//! contribution's "others' median" is one of two values (an even column) or three (odd),
//! chosen by which side of the middle its own value lies on. No contribution's rank is
//! needed, only the middle order statistics: a branch-free sorting network puts them in
//! place, and one comparison per contribution picks its median. Every choice is between
//! values that are bit-identical wherever a tie could make it ambiguous, so the result is
//! the same bits as ranking the column with ties broken by input order (checked against
//! that reference in the tests).

/// Compare-exchanges of `$k`'s elements, in order (each pair ends ascending).
macro_rules! exchange {
    ($k:ident; $($a:literal $b:literal),*) => {
        $(
            let (x, y) = ($k[$a], $k[$b]);
            $k[$a] = x.min(y);
            $k[$b] = x.max(y);
        )*
    };
}

/// Batcher's odd–even merge sort of 8 keys: 19 compare-exchanges, no branches.
fn sort8(k: &mut [i64; 8]) {
    exchange!(k; 0 1, 2 3, 4 5, 6 7, 0 2, 1 3, 4 6, 5 7, 1 2, 5 6, 0 4, 1 5, 2 6, 3 7, 2 4, 3 5,
        1 2, 3 4, 5 6);
}

/// Batcher's odd–even merge sort of 16 keys: 63 compare-exchanges, no branches.
fn sort16(k: &mut [i64; 16]) {
    exchange!(k; 0 1, 2 3, 4 5, 6 7, 8 9, 10 11, 12 13, 14 15, 0 2, 1 3, 4 6, 5 7, 8 10, 9 11,
        12 14, 13 15, 1 2, 5 6, 9 10, 13 14, 0 4, 1 5, 2 6, 3 7, 8 12, 9 13, 10 14, 11 15, 2 4,
        3 5, 10 12, 11 13, 1 2, 3 4, 5 6, 9 10, 11 12, 13 14, 0 8, 1 9, 2 10, 3 11, 4 12, 5 13,
        6 14, 7 15, 4 8, 5 9, 6 10, 7 11, 2 4, 3 5, 6 8, 7 9, 10 12, 11 13, 1 2, 3 4, 5 6, 7 8,
        9 10, 11 12, 13 14);
}

/// The middle of a column of at least two keys: its lower-middle, middle and upper-middle
/// order statistics (`n/2 − 1`, `n/2`, `n/2 + 1`; the last is `i64::MAX` for two keys).
/// Up to 16 keys are sorted by a branch-free network in registers (padded with `i64::MAX`,
/// which no finite value's key reaches, so the padding stays at the end); larger rounds
/// by a comparison sort into `spill`.
pub(super) fn middle_keys(keys: &[i64], spill: &mut Vec<i64>) -> [i64; 3] {
    let h = keys.len() / 2;
    let at = |s: &[i64]| [s[h - 1], s[h], s.get(h + 1).copied().unwrap_or(i64::MAX)];
    if keys.len() <= 8 {
        let mut k = [i64::MAX; 8];
        k.iter_mut().zip(keys).for_each(|(d, &s)| *d = s);
        sort8(&mut k);
        at(&k[..keys.len()])
    } else if keys.len() <= 16 {
        let mut k = [i64::MAX; 16];
        k.iter_mut().zip(keys).for_each(|(d, &s)| *d = s);
        sort16(&mut k);
        at(&k[..keys.len()])
    } else {
        spill.clear();
        spill.extend_from_slice(keys);
        spill.sort_unstable();
        at(spill)
    }
}

/// The value whose [`super::agreement::total_key`] is `key` (the key's map is its own
/// inverse: it flips the bits below the sign, and only when the sign is set).
pub(super) fn value_of(key: i64) -> f64 {
    f64::from_bits((key ^ ((((key >> 63) as u64) >> 1) as i64)) as u64)
}

/// Whether `key` is a zero's (`+0.0` or `−0.0`).
pub(super) fn is_zero(key: i64) -> bool {
    key == 0 || key == -1
}

/// The median of the column whose keys are `keys` (at least two; `middle` its
/// [`middle_keys`]), with `others[i]` set to the median of the column without its `i`-th
/// value (medians of an even count are the mean of the two middle values).
pub(super) fn medians(keys: &[i64], middle: [i64; 3], others: &mut [f64]) -> f64 {
    let [a, b, c] = middle;
    if keys.len() % 2 == 0 {
        // Without a value of the lower half the others' median is the upper middle value;
        // without one of the upper half, the lower. A value equal to the lower middle one
        // is of the lower half unless both middle values are equal, and then either is it.
        let (va, vb) = (value_of(a), value_of(b));
        for (o, &k) in others.iter_mut().zip(keys) {
            *o = if k > a { va } else { vb };
        }
        0.5 * (va + vb)
    } else {
        // Odd: the median is the middle value; without a value below it the others'
        // median is the mean of the middle and the next, above it of the previous and the
        // middle, and without the middle itself of its two neighbours. Where a value ties
        // with the middle one, its neighbour on that side is the same bits, so the three
        // means coincide as the ranks would pick them.
        let (va, vb, vc) = (value_of(a), value_of(b), value_of(c));
        let (below, at, above) = (0.5 * (vb + vc), 0.5 * (va + vc), 0.5 * (va + vb));
        for (o, &k) in others.iter_mut().zip(keys) {
            *o = if k < b {
                below
            } else if k > b {
                above
            } else {
                at
            };
        }
        vb
    }
}

/// Buffers of [`medians_of_votes`].
#[derive(Default)]
pub(super) struct Votes {
    keys: Vec<i64>,
    others: Vec<f64>,
}

/// [`medians`] where a zero is no vote (a coordinate a sparse delta did not send): the
/// medians are over the non-zero values; a zero's "others' median" is the whole median,
/// and with fewer than two votes a vote's is 0.
pub(super) fn medians_of_votes(
    keys: &[i64],
    votes: &mut Votes,
    spill: &mut Vec<i64>,
    others: &mut [f64],
) -> f64 {
    votes.keys.clear();
    votes.keys.extend(keys.iter().copied().filter(|&k| !is_zero(k)));
    votes.others.resize(votes.keys.len(), 0.0);
    let r = match votes.keys.len() {
        0 => 0.0,
        1 => value_of(votes.keys[0]),
        _ => medians(&votes.keys, middle_keys(&votes.keys, spill), &mut votes.others),
    };
    let many = votes.keys.len() >= 2;
    let mut voted = votes.others.iter();
    for (o, &k) in others.iter_mut().zip(keys) {
        *o = if is_zero(k) {
            r
        } else if many {
            voted.next().copied().unwrap_or(0.0)
        } else {
            0.0
        };
    }
    r
}

#[cfg(test)]
mod tests {
    use super::super::agreement::{median_of_sorted, median_without, ranks, total_key};
    use super::*;

    /// A column's keys, each value's rank (ties by input order) and the values in that
    /// order: the reference the medians must match.
    fn ranked(column: &[f64]) -> (Vec<i64>, Vec<usize>, Vec<f64>) {
        let keys: Vec<i64> = column.iter().map(|v| total_key(*v)).collect();
        let mut rank = vec![0; column.len()];
        ranks(&keys, &mut Vec::new(), &mut rank);
        let mut sorted = vec![0f64; column.len()];
        for (i, &k) in rank.iter().enumerate() {
            sorted[k] = column[i];
        }
        (keys, rank, sorted)
    }

    /// xorshift64: the tests' seeded columns.
    fn next(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// The networks sort every column of zeros and ones of up to 16 keys (by the 0–1
    /// principle, so every column of those sizes), and the middle keys of random columns
    /// of every size to 40 are a sort's.
    #[test]
    fn the_middle_keys_are_a_sort_s() {
        for bits in 0u32..(1 << 16) {
            let mut k16: [i64; 16] = std::array::from_fn(|i| i64::from((bits >> i) & 1));
            sort16(&mut k16);
            assert!(k16.windows(2).all(|w| w[0] <= w[1]), "{bits:016b}");
            let mut k8: [i64; 8] = std::array::from_fn(|i| i64::from((bits >> i) & 1));
            sort8(&mut k8);
            assert!(k8.windows(2).all(|w| w[0] <= w[1]), "{bits:08b}");
        }
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut spill = Vec::new();
        for n in 2..=40usize {
            for _ in 0..200 {
                let keys: Vec<i64> = (0..n).map(|_| (next(&mut x) % 7) as i64 - 3).collect();
                let mut sorted = keys.clone();
                sorted.sort_unstable();
                let h = n / 2;
                let want =
                    [sorted[h - 1], sorted[h], sorted.get(h + 1).copied().unwrap_or(i64::MAX)];
                assert_eq!(middle_keys(&keys, &mut spill), want, "{keys:?}");
            }
        }
    }

    /// The same bits as ranking the column (ties by input order) and taking each value's
    /// median without it: columns with many ties, signed zeros and both parities.
    #[test]
    fn medians_match_the_ranked_column() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let pool = [0.0, -0.0, 0.5, -0.5, 0.25, 1e-300, -1e-300, 3.0, -3.0];
        for n in 2..=40usize {
            let mut spill = Vec::new();
            for trial in 0..300 {
                let column: Vec<f64> = (0..n)
                    .map(|_| {
                        let x = next(&mut x);
                        if trial % 2 == 0 {
                            pool[(x % pool.len() as u64) as usize]
                        } else {
                            (x % 2001) as f64 / 1000.0 - 1.0
                        }
                    })
                    .collect();
                let (keys, rank, sorted_values) = ranked(&column);
                let mut others = vec![f64::NAN; n];
                let r = medians(&keys, middle_keys(&keys, &mut spill), &mut others);
                assert_eq!(r.to_bits(), median_of_sorted(&sorted_values).to_bits(), "{column:?}");
                for i in 0..n {
                    let want = median_without(&sorted_values, rank[i]);
                    assert_eq!(others[i].to_bits(), want.to_bits(), "n {n} i {i} {column:?}");
                }
            }
        }
    }

    /// With zeros abstaining, the same bits as ranking the column and taking the medians
    /// over its non-zero values (as the sparse merge did before).
    #[test]
    fn votes_match_the_ranked_non_zero_values() {
        let mut x = 0x51_7cc1_b727_220au64;
        let pool = [0.0, -0.0, 0.0, 0.5, -0.5, 0.25, -3.0];
        let (mut votes, mut spill) = (Votes::default(), Vec::new());
        for n in 1..=24usize {
            for _ in 0..300 {
                let column: Vec<f64> =
                    (0..n).map(|_| pool[(next(&mut x) % pool.len() as u64) as usize]).collect();
                let (keys, rank, sorted) = ranked(&column);
                let (mut voters, mut at) = (Vec::new(), vec![0; n]);
                for (k, &v) in sorted.iter().enumerate() {
                    at[k] = voters.len();
                    if v != 0.0 {
                        voters.push(v);
                    }
                }
                let want_r = if voters.is_empty() { 0.0 } else { median_of_sorted(&voters) };
                let mut others = vec![f64::NAN; n];
                let r = medians_of_votes(&keys, &mut votes, &mut spill, &mut others);
                assert_eq!(r.to_bits(), want_r.to_bits(), "{column:?}");
                for i in 0..n {
                    let want = if column[i] == 0.0 {
                        want_r
                    } else if voters.len() < 2 {
                        0.0
                    } else {
                        median_without(&voters, at[rank[i]])
                    };
                    assert_eq!(others[i].to_bits(), want.to_bits(), "i {i} {column:?}");
                }
            }
        }
    }
}
