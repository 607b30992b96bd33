//! Micro benchmark of the delta codec and the merge: throughput of encode / decode /
//! merge, and the error and compression ratio of each codec on delta-like data.
//!
//! `cargo bench --bench codec -- [--numel N] [--peers M]`

use atoll::delta::{self, Codec, DeltaMeta, EncodeOptions, ErrorFeedback, Limits};
use atoll::fragment::{FragmentSpec, TensorSpec};
use atoll::proto::merge::{self, Input};
use atoll::proto::MergeRule;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

/// Approximately Gaussian values (sum of uniforms), with a few heavy outliers as real
/// outer deltas have.
fn delta_like(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let g: f32 = (0..4).map(|_| rng.random_range(-1.0f32..1.0)).sum::<f32>() * 1e-3;
            if rng.random_bool(0.001) {
                g * 20.0
            } else {
                g
            }
        })
        .collect()
}

/// Best of `reps` runs of `f`, in seconds.
fn best<T>(reps: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut out = None;
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        let v = f();
        best = best.min(t.elapsed().as_secs_f64());
        out = Some(v);
    }
    (best, out.unwrap_or_else(|| unreachable!()))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1));
    let numel: usize = value("--numel").and_then(|s| s.parse().ok()).unwrap_or(1 << 20);
    let peers: usize = value("--peers").and_then(|s| s.parse().ok()).unwrap_or(8);
    let spec = FragmentSpec {
        id: 0,
        tensors: vec![TensorSpec { name: "w".into(), shape: vec![numel], is_embedding: false }],
    };
    let x = delta_like(numel, 1);
    let norm = delta::l2_norm(&x);
    let mb = (numel * 4) as f64 / 1e6;
    println!("fragment: {numel} f32 ({mb:.1} MB raw); best of 5; one thread");
    println!("| codec | bytes | ratio vs f32 | rel. L2 error | encode MB/s | decode MB/s |");
    println!("|---|---:|---:|---:|---:|---:|");
    let dense =
        |codec| EncodeOptions { codec, block: 64, zstd_level: 3, keep: 0, ..Default::default() };
    let sparse =
        |codec| EncodeOptions { codec, block: 4096, zstd_level: 3, keep: 64, ..Default::default() };
    let cells = [
        ("F32", dense(Codec::F32)),
        ("Q8", dense(Codec::Q8)),
        ("Q4", dense(Codec::Q4)),
        ("Top2", sparse(Codec::Top2)),
        ("Top1", sparse(Codec::Top1)),
        ("Top2 512/4096 (the default run's)", atoll::manifest::default_encode()),
    ];
    println!("(top2/top1: 64 of each 4096 unless named; rel. L2 error of one delta, before error feedback)");
    for (name, opts) in cells {
        let meta = DeltaMeta { author: 1, fragment: 0, round: 1, tokens: 1, steps: 1 };
        let (te, enc) = best(5, || {
            let mut fb = ErrorFeedback::new(numel);
            delta::encode(meta, &x, Some(&mut fb), &opts).unwrap_or_else(|e| panic!("{e}"))
        });
        let (td, dec) = best(5, || {
            delta::decode(&enc.bytes, &spec, &Limits::default()).unwrap_or_else(|e| panic!("{e}"))
        });
        let err: Vec<f32> = x.iter().zip(&dec.values).map(|(a, b)| a - b).collect();
        println!(
            "| {name} | {} ({:.3} bits/value) | {:.2} | {:.4} | {:.0} | {:.0} |",
            enc.bytes.len(),
            (enc.bytes.len() * 8) as f64 / numel as f64,
            (numel * 4) as f64 / enc.bytes.len() as f64,
            delta::l2_norm(&err) / norm,
            mb / te,
            mb / td
        );
    }
    let deltas: Vec<Vec<f32>> = (0..peers).map(|i| delta_like(numel, 10 + i as u64)).collect();
    let mut inputs: Vec<Input<'_>> = deltas
        .iter()
        .enumerate()
        .map(|(i, d)| Input {
            hash: delta::ContentHash::of(&i.to_le_bytes()),
            author: atoll::proto::PeerId(i as u64),
            tokens: 1000,
            steps: 10,
            values: d,
        })
        .collect();
    merge::canonical_order(&mut inputs);
    let bounds = merge::Bounds::default();
    for rule in [MergeRule::Rda, MergeRule::Mean, MergeRule::TrimmedMean] {
        let (t, _) = best(3, || merge::combine(&spec, &inputs, rule, &bounds));
        println!(
            "merge {rule:?} of {peers} deltas: {:.0} MB/s of input ({:.1} ms)",
            mb * peers as f64 / t,
            t * 1e3
        );
    }
    // What the defences against well-formed poison cost (issue 21): the default merge
    // against one with no norm clip, no author cap and no agreement weights.
    let open =
        merge::Bounds { clip: f64::INFINITY, max_share: f64::INFINITY, agree: false, ..bounds };
    for rule in [MergeRule::Rda, MergeRule::Mean] {
        let (on, _) = best(3, || merge::combine(&spec, &inputs, rule, &bounds));
        let (off, _) = best(3, || merge::combine(&spec, &inputs, rule, &open));
        println!(
            "merge {rule:?} of {peers} deltas, defences on / off: {:.1} / {:.1} ms ({:+.0}%)",
            on * 1e3,
            off * 1e3,
            (on / off - 1.0) * 100.0
        );
    }
}
