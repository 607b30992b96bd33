//! Cost of drawing a training batch from each kind of corpus: the embedded text (memory),
//! the same text as a file on disk, and the same words as JSONL documents; and the start-up
//! cost of cutting the corpus into blocks (the JSONL scan). Compare the per-batch time with
//! an inner step's (`cargo bench --bench throughput`).
//!
//! `cargo bench --bench data -- [--batches N]`

use std::time::Instant;

use atoll::data::{Corpus, Dataset, Shard};
use atoll::train::preset::Preset;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let batches: u64 = args
        .iter()
        .position(|a| a == "--batches")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(2000);
    let dir = tempfile::tempdir()?;
    let embedded = Corpus::embedded()?;
    let mut text = vec![0; embedded.len() as usize];
    embedded.parts()[0].read_at(0, &mut text)?;
    std::fs::write(dir.path().join("text.txt"), &text)?;
    // Documents of 200 words, as a web-text dump would hold them.
    let words: Vec<&str> = std::str::from_utf8(&text)?.split_whitespace().collect();
    let mut jsonl = String::new();
    for doc in words.chunks(200) {
        jsonl.push_str(&serde_json::json!({ "text": doc.join(" ") }).to_string());
        jsonl.push('\n');
    }
    std::fs::write(dir.path().join("docs.jsonl"), &jsonl)?;
    let sources = [
        ("memory (embedded)", embedded),
        ("text file", Corpus::load(&dir.path().join("text.txt"))?),
        ("jsonl file", Corpus::load(&dir.path().join("docs.jsonl"))?),
    ];
    println!("{batches} batches per row; corpus {} bytes of text", text.len());
    println!("| corpus | preset | rows × context | blocks (ms) | µs per batch |");
    println!("|---|---|---|---:|---:|");
    for preset in [Preset::Default, Preset::Base] {
        let config = preset.train_config(0);
        for (name, corpus) in &sources {
            let t = Instant::now();
            let data = Dataset::new(corpus, config.model.context, 0, Shard { index: 1, count: 4 })?;
            let split_ms = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            for step in 0..batches {
                std::hint::black_box(data.train_batch(step, config.batch)?);
            }
            let per = t.elapsed().as_secs_f64() * 1e6 / batches as f64;
            println!(
                "| {name} | {preset:?} | {} × {} | {split_ms:.1} | {per:.1} |",
                config.batch, config.model.context
            );
        }
    }
    Ok(())
}
