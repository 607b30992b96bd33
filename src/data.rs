//! Training data: a corpus of bytes, a held-out validation split, disjoint training shards
//! per peer, and batches that are a pure function of `(seed, shard, step)`.
//!
//! The corpus is cut into blocks of up to [`MAX_BLOCK`] bytes. Every [`VAL_EVERY`]-th block
//! is validation (the same for every run, so `val_bpb` compares across runs and seeds); the
//! rest are shuffled with the run seed and dealt round-robin to `count` shards. A batch row
//! is a random window inside one block of the peer's shard. Because a batch depends only on
//! the step number, a restarted peer resumes its data stream exactly from the checkpointed
//! step.

pub mod corpus;

use std::ops::Range;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

pub use corpus::{Corpus, DataError};

/// Largest block: bigger blocks mean fewer, more uniform shards.
pub const MAX_BLOCK: usize = 4096;
/// One block in this many is held out for validation.
pub const VAL_EVERY: usize = 20;
/// Seed of the validation windows: fixed, so every run scores on the same text.
const VAL_SEED: u64 = 0x7661_6c69_6461_7465;

/// Which slice of the training blocks a peer trains on: shard `index` of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    /// The whole training split (a peer alone).
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };
}

impl std::str::FromStr for Shard {
    type Err = String;
    /// Parses `I/N`, e.g. `2/4`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || format!("shard must look like I/N with I < N, e.g. 0/4; got {s:?}");
        let (i, n) = s.split_once('/').ok_or_else(err)?;
        let index: u32 = i.trim().parse().map_err(|_| err())?;
        let count: u32 = n.trim().parse().map_err(|_| err())?;
        if count == 0 || index >= count {
            return Err(err());
        }
        Ok(Shard { index, count })
    }
}

/// One batch: `rows` windows of `context` input bytes and the bytes that follow each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub rows: usize,
    pub context: usize,
    /// Row-major `[rows, context]` input tokens.
    pub inputs: Vec<i64>,
    /// Row-major `[rows, context]` targets: `inputs` shifted left by one byte.
    pub targets: Vec<i64>,
}

impl Batch {
    /// Number of tokens (predictions) in the batch.
    pub fn tokens(&self) -> usize {
        self.rows * self.context
    }
}

/// A corpus split into validation blocks and one peer's training shard.
#[derive(Debug, Clone)]
pub struct Dataset {
    bytes: Arc<[u8]>,
    context: usize,
    seed: u64,
    shard: Shard,
    train: Vec<Range<usize>>,
    val: Vec<Range<usize>>,
}

impl Dataset {
    /// Splits `corpus` for a model of context `context`, run seed `seed`, shard `shard`.
    pub fn new(
        corpus: &Corpus,
        context: usize,
        seed: u64,
        shard: Shard,
    ) -> Result<Self, DataError> {
        let bytes = corpus.bytes();
        let window = context + 1;
        // Aim for at least 2 * VAL_EVERY blocks so small files still get a validation split.
        let block = (bytes.len() / (2 * VAL_EVERY)).clamp(2 * window, MAX_BLOCK.max(2 * window));
        let needed = 2 * block;
        if bytes.len() < needed || shard.count == 0 || shard.index >= shard.count {
            return Err(DataError::TooSmall { bytes: bytes.len(), needed, context });
        }
        let blocks: Vec<Range<usize>> = (0..bytes.len())
            .step_by(block)
            .map(|start| start..(start + block).min(bytes.len()))
            .filter(|r| r.len() >= window)
            .collect();
        let (mut val, mut train) = (Vec::new(), Vec::new());
        for (i, r) in blocks.into_iter().enumerate() {
            if i % VAL_EVERY == VAL_EVERY - 1 {
                val.push(r)
            } else {
                train.push(r)
            }
        }
        if val.is_empty() {
            // Tiny corpora: hold out the last block.
            val.extend(train.pop());
        }
        shuffle(&mut train, seed);
        let train: Vec<_> = train
            .into_iter()
            .enumerate()
            .filter(|(i, _)| *i as u64 % u64::from(shard.count) == u64::from(shard.index))
            .map(|(_, r)| r)
            .collect();
        if train.is_empty() {
            return Err(DataError::EmptyShard { shard: shard.index, count: shard.count });
        }
        Ok(Self { bytes, context, seed, shard, train, val })
    }

    /// The training batch of inner step `step`: a pure function of seed, shard and step.
    pub fn train_batch(&self, step: u64, rows: usize) -> Batch {
        let mix = self.seed
            ^ (u64::from(self.shard.index) << 48)
            ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut rng = ChaCha8Rng::seed_from_u64(mix);
        self.sample(&self.train, &mut rng, rows)
    }

    /// The fixed validation set: `batches` batches of `rows` windows.
    pub fn val_batches(&self, batches: usize, rows: usize) -> Vec<Batch> {
        let mut rng = ChaCha8Rng::seed_from_u64(VAL_SEED);
        (0..batches).map(|_| self.sample(&self.val, &mut rng, rows)).collect()
    }

    /// This peer's shard.
    pub fn shard(&self) -> Shard {
        self.shard
    }

    /// Number of bytes in this peer's training shard.
    pub fn train_bytes(&self) -> usize {
        self.train.iter().map(Range::len).sum()
    }

    /// Number of held-out validation bytes.
    pub fn val_bytes(&self) -> usize {
        self.val.iter().map(Range::len).sum()
    }

    /// The training block ranges of this shard (for tests of disjointness).
    pub fn train_blocks(&self) -> &[Range<usize>] {
        &self.train
    }

    fn sample(&self, blocks: &[Range<usize>], rng: &mut ChaCha8Rng, rows: usize) -> Batch {
        let ctx = self.context;
        let mut inputs = Vec::with_capacity(rows * ctx);
        let mut targets = Vec::with_capacity(rows * ctx);
        for _ in 0..rows {
            let block = &blocks[rng.random_range(0..blocks.len())];
            let start = block.start + rng.random_range(0..=block.len() - (ctx + 1));
            let window = &self.bytes[start..start + ctx + 1];
            inputs.extend(window[..ctx].iter().map(|&b| i64::from(b)));
            targets.extend(window[1..].iter().map(|&b| i64::from(b)));
        }
        Batch { rows, context: ctx, inputs, targets }
    }
}

/// Fisher–Yates with a seeded generator (rand's `shuffle` is fine too, but this pins the
/// algorithm so shards never change under a dependency upgrade).
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for i in (1..items.len()).rev() {
        let j = rng.random_range(0..=i);
        items.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus(n: usize) -> Corpus {
        let text: String = (0..n).map(|i| char::from(b'a' + (i * 7 % 26) as u8)).collect();
        Corpus::from_text("test", text.into_bytes()).unwrap()
    }

    #[test]
    fn shards_are_disjoint_and_cover_the_training_split() {
        let c = corpus(200_000);
        let whole = Dataset::new(&c, 32, 7, Shard::WHOLE).unwrap();
        let mut seen: Vec<Range<usize>> = Vec::new();
        for index in 0..4 {
            let d = Dataset::new(&c, 32, 7, Shard { index, count: 4 }).unwrap();
            for b in d.train_blocks() {
                assert!(!seen.contains(b), "block {b:?} in two shards");
                assert!(!d.val.contains(b), "training block {b:?} is also validation");
                seen.push(b.clone());
            }
        }
        assert_eq!(seen.len(), whole.train_blocks().len());
    }

    #[test]
    fn batches_are_a_function_of_step_and_targets_shift_inputs() {
        let c = corpus(100_000);
        let d = Dataset::new(&c, 16, 3, Shard { index: 1, count: 2 }).unwrap();
        assert_eq!(d.train_batch(5, 4), d.train_batch(5, 4));
        assert_ne!(d.train_batch(5, 4), d.train_batch(6, 4));
        let b = d.train_batch(0, 3);
        for row in 0..3 {
            let (i, t) =
                (&b.inputs[row * 16..(row + 1) * 16], &b.targets[row * 16..(row + 1) * 16]);
            assert_eq!(&i[1..], &t[..15]);
        }
        // Validation ignores the run seed and the shard.
        let other = Dataset::new(&c, 16, 99, Shard::WHOLE).unwrap();
        assert_eq!(d.val_batches(2, 4), other.val_batches(2, 4));
    }

    #[test]
    fn too_small_and_bad_shards_are_errors() {
        let c = corpus(100);
        assert!(matches!(Dataset::new(&c, 64, 0, Shard::WHOLE), Err(DataError::TooSmall { .. })));
        assert!("3/3".parse::<Shard>().is_err());
        assert!("x".parse::<Shard>().is_err());
        assert_eq!("1/3".parse::<Shard>(), Ok(Shard { index: 1, count: 3 }));
    }
}
