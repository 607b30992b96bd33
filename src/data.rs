//! Training data: a corpus of text or JSONL files, a held-out validation split, disjoint
//! training shards per peer, and batches that are a pure function of `(seed, shard, step)`.
//!
//! Each part of the corpus is cut into blocks of about [`MAX_BLOCK`] bytes (JSONL blocks end
//! at line ends). Every [`VAL_EVERY`]-th block is validation (the same for every run, so
//! `val_bpb` compares across runs and seeds); the rest are shuffled with the run seed and
//! dealt round-robin to `count` shards. A batch row is a random window inside one block of
//! the peer's shard, read from disk when it is drawn, so a corpus may be larger than memory:
//! a peer holds only the block table. Because a batch depends only on the step number, a
//! restarted peer resumes its data stream exactly from the checkpointed step.

pub mod corpus;

use std::io::Read;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

pub use corpus::{Corpus, DataError, Format, Part};

/// Largest block of a small corpus: bigger blocks mean fewer, more uniform shards.
pub const MAX_BLOCK: usize = 4096;
/// Most blocks in a table: a larger corpus gets larger blocks (the table stays under 48 MiB).
pub const MAX_BLOCKS: u64 = 2 << 20;
/// One block in this many is held out for validation.
pub const VAL_EVERY: usize = 20;
/// Read buffer of the scan that cuts JSONL files at line ends.
pub const READ_BUF: usize = 64 << 10;
/// Longest JSONL line accepted.
pub const MAX_LINE: u64 = 64 << 20;
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

    /// The batch of rows `rows` of this one (clamped to its rows).
    pub fn rows_slice(&self, rows: std::ops::Range<usize>) -> Batch {
        let end = rows.end.min(self.rows);
        let start = rows.start.min(end);
        let span = start * self.context..end * self.context;
        Batch {
            rows: end - start,
            context: self.context,
            inputs: self.inputs[span.clone()].to_vec(),
            targets: self.targets[span].to_vec(),
        }
    }
}

/// A run of bytes in one part of the corpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub part: u32,
    pub start: u64,
    pub len: u64,
}

/// A corpus split into validation blocks and one peer's training shard.
#[derive(Debug, Clone)]
pub struct Dataset {
    corpus: Corpus,
    context: usize,
    seed: u64,
    shard: Shard,
    train: Vec<Block>,
    val: Vec<Block>,
}

impl Dataset {
    /// Splits `corpus` for a model of context `context`, run seed `seed`, shard `shard`.
    /// Reads nothing of a text file; reads each JSONL file once, to find its line ends.
    pub fn new(
        corpus: &Corpus,
        context: usize,
        seed: u64,
        shard: Shard,
    ) -> Result<Self, DataError> {
        let total = corpus.len();
        let window = context as u64 + 1;
        // Aim for at least 2 * VAL_EVERY blocks so small files still get a validation split.
        let block = (total / (2 * VAL_EVERY as u64))
            .clamp(2 * window, (MAX_BLOCK as u64).max(2 * window))
            .max(total.div_ceil(MAX_BLOCKS));
        let needed = 2 * block;
        if total < needed || shard.count == 0 || shard.index >= shard.count {
            return Err(DataError::TooSmall { bytes: total, needed, context });
        }
        let mut blocks = Vec::new();
        for (index, part) in corpus.parts().iter().enumerate() {
            let index = index as u32;
            match part.format() {
                Format::Text => blocks.extend(
                    (0..part.len())
                        .step_by(block as usize)
                        .map(|start| Block {
                            part: index,
                            start,
                            len: block.min(part.len() - start),
                        })
                        .filter(|b| b.len >= window),
                ),
                Format::Jsonl => jsonl_blocks(part, index, block, &mut blocks)?,
            }
        }
        let (mut val, mut train) = (Vec::new(), Vec::new());
        for (i, b) in blocks.into_iter().enumerate() {
            if i % VAL_EVERY == VAL_EVERY - 1 {
                val.push(b)
            } else {
                train.push(b)
            }
        }
        if val.is_empty() {
            // Tiny corpora: hold out the last block.
            val.extend(train.pop());
        }
        if val.is_empty() {
            return Err(DataError::TooSmall { bytes: total, needed, context });
        }
        shuffle(&mut train, seed);
        let train: Vec<_> = train
            .into_iter()
            .enumerate()
            .filter(|(i, _)| *i as u64 % u64::from(shard.count) == u64::from(shard.index))
            .map(|(_, b)| b)
            .collect();
        if train.is_empty() {
            return Err(DataError::EmptyShard { shard: shard.index, count: shard.count });
        }
        Ok(Self { corpus: corpus.clone(), context, seed, shard, train, val })
    }

    /// The training batch of inner step `step`: a pure function of seed, shard and step.
    /// Fails only if a file of the corpus became unreadable or shrank.
    pub fn train_batch(&self, step: u64, rows: usize) -> Result<Batch, DataError> {
        let mix = self.seed
            ^ (u64::from(self.shard.index) << 48)
            ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut rng = ChaCha8Rng::seed_from_u64(mix);
        self.sample(&self.train, &mut rng, rows)
    }

    /// The fixed validation set: `batches` batches of `rows` windows.
    pub fn val_batches(&self, batches: usize, rows: usize) -> Result<Vec<Batch>, DataError> {
        let mut rng = ChaCha8Rng::seed_from_u64(VAL_SEED);
        (0..batches).map(|_| self.sample(&self.val, &mut rng, rows)).collect()
    }

    /// This peer's shard.
    pub fn shard(&self) -> Shard {
        self.shard
    }

    /// Number of bytes in this peer's training shard (raw bytes for JSONL).
    pub fn train_bytes(&self) -> u64 {
        self.train.iter().map(|b| b.len).sum()
    }

    /// Number of held-out validation bytes (raw bytes for JSONL).
    pub fn val_bytes(&self) -> u64 {
        self.val.iter().map(|b| b.len).sum()
    }

    /// The training blocks of this shard (for tests of disjointness).
    pub fn train_blocks(&self) -> &[Block] {
        &self.train
    }

    /// The validation blocks.
    pub fn val_blocks(&self) -> &[Block] {
        &self.val
    }

    fn sample(
        &self,
        blocks: &[Block],
        rng: &mut ChaCha8Rng,
        rows: usize,
    ) -> Result<Batch, DataError> {
        let ctx = self.context;
        let mut inputs = Vec::with_capacity(rows * ctx);
        let mut targets = Vec::with_capacity(rows * ctx);
        let mut window = vec![0u8; ctx + 1];
        for _ in 0..rows {
            let block = &blocks[rng.random_range(0..blocks.len())];
            let part = &self.corpus.parts()[block.part as usize];
            match part.format() {
                Format::Text => {
                    // Drawn as a usize, as before files were read from disk: the embedded
                    // corpus gives the same batches as ever (rand samples usize ranges
                    // that fit 32 bits as u32, u64 ranges as u64).
                    let span = usize::try_from(block.len).unwrap_or(usize::MAX) - (ctx + 1);
                    let start = block.start + rng.random_range(0..=span) as u64;
                    part.read_at(start, &mut window)?;
                }
                Format::Jsonl => {
                    let text = jsonl_block_text(part, block, ctx + 1)?;
                    let start = rng.random_range(0..=text.len() - (ctx + 1));
                    window.copy_from_slice(&text[start..start + ctx + 1]);
                }
            }
            inputs.extend(window[..ctx].iter().map(|&b| i64::from(b)));
            targets.extend(window[1..].iter().map(|&b| i64::from(b)));
        }
        Ok(Batch { rows, context: ctx, inputs, targets })
    }
}

/// Cuts a JSONL part into blocks of whole lines, each at least `block` bytes (but the last),
/// reading it once through a [`READ_BUF`] buffer.
fn jsonl_blocks(
    part: &Part,
    index: u32,
    block: u64,
    out: &mut Vec<Block>,
) -> Result<(), DataError> {
    let io = |e| DataError::Io { path: part.path().to_owned(), source: e };
    let mut reader = part.reader()?;
    let mut buf = vec![0u8; READ_BUF];
    let (mut offset, mut start, mut line_start) = (0u64, 0u64, 0u64);
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(e)),
        };
        for i in memchr::memchr_iter(b'\n', &buf[..n]) {
            let end = offset + i as u64 + 1;
            if end - line_start > MAX_LINE {
                return Err(long_line(part, line_start));
            }
            line_start = end;
            if end - start >= block {
                out.push(Block { part: index, start, len: end - start });
                start = end;
            }
        }
        offset += n as u64;
        if offset - line_start > MAX_LINE {
            return Err(long_line(part, line_start));
        }
    }
    if offset > start {
        out.push(Block { part: index, start, len: offset - start });
    }
    Ok(())
}

fn long_line(part: &Part, offset: u64) -> DataError {
    let reason = format!("line longer than {MAX_LINE} bytes");
    DataError::Jsonl { path: part.path().to_owned(), offset, reason }
}

/// The text of a JSONL block: each line's `"text"` followed by a newline, padded with
/// newlines to at least `min` bytes.
fn jsonl_block_text(part: &Part, block: &Block, min: usize) -> Result<Vec<u8>, DataError> {
    let mut raw = vec![0u8; block.len as usize];
    part.read_at(block.start, &mut raw)?;
    let mut text = Vec::with_capacity(raw.len());
    let mut offset = block.start;
    for line in raw.split_inclusive(|&b| b == b'\n') {
        if let Some(t) = corpus::jsonl_text(line, part.path(), offset)? {
            text.extend_from_slice(t.as_bytes());
            text.push(b'\n');
        }
        offset += line.len() as u64;
    }
    if text.len() < min {
        text.resize(min, b'\n');
    }
    Ok(text)
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
        let mut seen: Vec<Block> = Vec::new();
        for index in 0..4 {
            let d = Dataset::new(&c, 32, 7, Shard { index, count: 4 }).unwrap();
            for b in d.train_blocks() {
                assert!(!seen.contains(b), "block {b:?} in two shards");
                assert!(!d.val.contains(b), "training block {b:?} is also validation");
                seen.push(*b);
            }
        }
        assert_eq!(seen.len(), whole.train_blocks().len());
    }

    #[test]
    fn batches_are_a_function_of_step_and_targets_shift_inputs() {
        let c = corpus(100_000);
        let d = Dataset::new(&c, 16, 3, Shard { index: 1, count: 2 }).unwrap();
        assert_eq!(d.train_batch(5, 4).unwrap(), d.train_batch(5, 4).unwrap());
        assert_ne!(d.train_batch(5, 4).unwrap(), d.train_batch(6, 4).unwrap());
        let b = d.train_batch(0, 3).unwrap();
        for row in 0..3 {
            let (i, t) =
                (&b.inputs[row * 16..(row + 1) * 16], &b.targets[row * 16..(row + 1) * 16]);
            assert_eq!(&i[1..], &t[..15]);
        }
        // Validation ignores the run seed and the shard.
        let other = Dataset::new(&c, 16, 99, Shard::WHOLE).unwrap();
        assert_eq!(d.val_batches(2, 4).unwrap(), other.val_batches(2, 4).unwrap());
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
