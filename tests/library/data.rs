//! The data loader on files a user has: directories of text and JSONL, read from disk a
//! window at a time, sharded per peer.

use std::path::Path;

use atoll::data::{Block, Corpus, DataError, Dataset, Format, Shard, READ_BUF};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A JSONL file of `n` documents of seeded random lengths (some longer than a block and
/// than the read buffer), with quotes, escapes and multi-byte characters; returns the texts.
fn write_jsonl(path: &Path, n: usize, seed: u64) -> Vec<String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut file = String::new();
    let mut texts = Vec::new();
    for i in 0..n {
        let len =
            if i % 97 == 13 { rng.random_range(70_000..90_000) } else { rng.random_range(1..900) };
        let text: String = (0..len)
            .map(|j| match (i + j) % 53 {
                0 => '\n',
                1 => '"',
                2 => 'é',
                _ => char::from(b'a' + rng.random_range(0..26u8)),
            })
            .collect();
        file.push_str(&serde_json::json!({ "text": text, "id": i }).to_string());
        file.push('\n');
        if i % 31 == 7 {
            file.push('\n'); // blank lines are skipped
        }
        texts.push(text);
    }
    std::fs::write(path, file).unwrap();
    texts
}

fn window_of(batch: &atoll::data::Batch, row: usize) -> Vec<u8> {
    let c = batch.context;
    let mut w: Vec<u8> = batch.inputs[row * c..(row + 1) * c].iter().map(|&b| b as u8).collect();
    w.push(batch.targets[(row + 1) * c - 1] as u8);
    w
}

#[test]
fn jsonl_is_cut_at_line_ends_across_read_buffers_and_windows_are_its_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.jsonl");
    let texts = write_jsonl(&path, 600, 1);
    let raw = std::fs::read(&path).unwrap();
    assert!(raw.len() > 8 * READ_BUF, "the file must span many read buffers: {}", raw.len());

    let corpus = Corpus::load(&path).unwrap();
    assert_eq!(corpus.parts()[0].format(), Format::Jsonl);
    let data = Dataset::new(&corpus, 48, 5, Shard::WHOLE).unwrap();
    let mut blocks: Vec<Block> =
        data.train_blocks().iter().chain(data.val_blocks()).copied().collect();
    blocks.sort_by_key(|b| b.start);
    // Contiguous, covering the file, every block whole lines.
    let mut at = 0;
    for b in &blocks {
        assert_eq!(b.start, at, "blocks leave a gap or overlap");
        at += b.len;
        assert_eq!(raw[(b.start + b.len - 1) as usize], b'\n', "block {b:?} cuts a line");
    }
    assert_eq!(at, raw.len() as u64);

    // Every window is a piece of the documents' text, never of the JSON around it.
    let joined: String = texts.iter().map(|t| format!("{t}\n")).collect();
    let joined = joined.as_bytes();
    for step in 0..40 {
        let batch = data.train_batch(step, 8).unwrap();
        for row in 0..8 {
            let w = window_of(&batch, row);
            assert!(joined.windows(w.len()).any(|x| x == w), "step {step} row {row}: not text");
        }
    }
}

#[test]
fn a_text_file_on_disk_trains_on_the_same_batches_as_its_text_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("book.txt");
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let text: Vec<u8> = (0..6 * READ_BUF).map(|_| b'a' + rng.random_range(0..26u8)).collect();
    std::fs::write(&path, &text).unwrap();
    let disk = Corpus::load(&path).unwrap();
    let memory = Corpus::from_text("book", text).unwrap();
    assert_ne!(disk.hash(), memory.hash(), "a file is named by its listing, text by its bytes");
    for shard in [Shard::WHOLE, Shard { index: 2, count: 3 }] {
        let (d, m) = (
            Dataset::new(&disk, 64, 9, shard).unwrap(),
            Dataset::new(&memory, 64, 9, shard).unwrap(),
        );
        for step in [0, 1, 77] {
            assert_eq!(d.train_batch(step, 6).unwrap(), m.train_batch(step, 6).unwrap());
        }
        assert_eq!(d.val_batches(3, 4).unwrap(), m.val_batches(3, 4).unwrap());
    }
}

#[test]
fn a_directory_of_text_and_jsonl_is_sharded_disjointly_per_peer() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("web")).unwrap();
    write_jsonl(&dir.path().join("web/a.jsonl"), 300, 3);
    write_jsonl(&dir.path().join("web/b.jsonl"), 200, 4);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for name in ["one.txt", "two.md"] {
        let text: Vec<u8> = (0..150_000).map(|_| b'a' + rng.random_range(0..26u8)).collect();
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let corpus = Corpus::load(dir.path()).unwrap();
    let formats: Vec<Format> = corpus.parts().iter().map(|p| p.format()).collect();
    assert_eq!(formats, [Format::Text, Format::Text, Format::Jsonl, Format::Jsonl]);

    let whole = Dataset::new(&corpus, 32, 11, Shard::WHOLE).unwrap();
    let mut seen = Vec::new();
    for index in 0..5 {
        let d = Dataset::new(&corpus, 32, 11, Shard { index, count: 5 }).unwrap();
        assert_eq!(d.val_blocks(), whole.val_blocks(), "every shard scores on the same text");
        for b in d.train_blocks() {
            assert!(!seen.contains(b), "{b:?} in two shards");
            assert!(!d.val_blocks().contains(b), "{b:?} is training and validation");
            seen.push(*b);
        }
        // Each shard draws from both formats, and its batches from its own blocks only.
        let parts: std::collections::BTreeSet<u32> =
            d.train_blocks().iter().map(|b| b.part).collect();
        assert_eq!(parts.len(), 4, "shard {index} misses a file");
        d.train_batch(3, 4).unwrap();
    }
    assert_eq!(seen.len(), whole.train_blocks().len());
    // Another seed deals other blocks to the same shard.
    let a = Dataset::new(&corpus, 32, 11, Shard { index: 0, count: 5 }).unwrap();
    let b = Dataset::new(&corpus, 32, 12, Shard { index: 0, count: 5 }).unwrap();
    assert_ne!(a.train_blocks(), b.train_blocks());
}

#[test]
fn a_file_that_shrinks_or_a_line_that_breaks_while_training_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("book.txt");
    std::fs::write(&path, "all the world's a stage. ".repeat(4000)).unwrap();
    let corpus = Corpus::load(&path).unwrap();
    let data = Dataset::new(&corpus, 32, 1, Shard::WHOLE).unwrap();
    data.train_batch(0, 4).unwrap();
    std::fs::write(&path, "gone").unwrap();
    let err = (0..20).find_map(|s| data.train_batch(s, 4).err()).expect("a read past the end");
    assert!(matches!(err, DataError::Changed { .. }), "{err}");

    // A malformed line past the checked head of the file fails the batch that reads it.
    let path = dir.path().join("docs.jsonl");
    let good = "{\"text\": \"a good line of text for the model\"}\n".repeat(4000);
    std::fs::write(&path, format!("{good}not json at all\n{good}")).unwrap();
    let corpus = Corpus::load(&path).unwrap();
    let data = Dataset::new(&corpus, 16, 1, Shard::WHOLE).unwrap();
    let err = (0..400)
        .find_map(|s| data.train_batch(s, 8).err())
        .or_else(|| data.val_batches(8, 8).err())
        .expect("the bad line is drawn");
    assert!(matches!(err, DataError::Jsonl { offset, .. } if offset == good.len() as u64), "{err}");
}
