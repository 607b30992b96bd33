//! The checkpoint loader (`atoll::checkpoint::load`, which takes a path) and what a loaded
//! checkpoint feeds (`Checkpoint::into_trainer`: burnpack model and optimizer records).
//! `load` checks a blake3 trailer over the whole file, so the harness always appends the
//! right trailer: a fuzzed file gets past the checksum and into the length fields, the
//! metadata JSON and the records.
//!
//! Mode 0 (even first byte): the input is the file body; the harness appends blake3(body).
//! Mode 1 (odd): a valid checkpoint of a tiny model (made once with `checkpoint::save`)
//! split into its meta / model / optim sections; the fuzzer edits the sections (and may
//! lie in the length fields or the version), the harness rebuilds header and trailer.
//! A loaded checkpoint whose model is small is turned back into a trainer.
//!
//! The file lives in /dev/shm (falls back to the temp dir), one per process.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use arbitrary::{Result, Unstructured};
use atoll::backend::Backend;
use atoll::checkpoint;
use atoll::data::{Corpus, Shard};
use atoll::train::{TrainConfig, Trainer};
use libfuzzer_sys::fuzz_target;

const HEADER_LEN: usize = 8 + 4 + 8 * 3;

struct Fixture {
    corpus: Corpus,
    path: PathBuf,
    meta: Vec<u8>,
    model: Vec<u8>,
    optim: Vec<u8>,
}

fn tiny() -> TrainConfig {
    let mut c = TrainConfig::tiny(1);
    c.model = c.model.with_d_model(8).with_n_heads(2).with_d_ff(16).with_context(8);
    c.batch = 2;
    c
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let base = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("atoll-fuzz-checkpoint-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let text = b"To be, or not to be, that is the question.\n".repeat(200);
        let corpus = Corpus::from_text("fuzz", text).unwrap();
        let shard = Shard { index: 0, count: 1 };
        let trainer = Trainer::new(tiny(), Backend::Flex, &corpus, shard).unwrap();
        let path = checkpoint::save(&trainer, shard, &corpus, &dir).unwrap();
        let file = std::fs::read(&path).unwrap();
        let len = |i: usize| {
            u64::from_le_bytes(file[12 + 8 * i..20 + 8 * i].try_into().unwrap()) as usize
        };
        let (m, a) = (HEADER_LEN + len(0), HEADER_LEN + len(0) + len(1));
        // The fixture loads and restores: the harness starts from a valid checkpoint.
        checkpoint::load(&path).unwrap().into_trainer(&corpus).unwrap();
        Fixture {
            corpus,
            meta: file[HEADER_LEN..m].to_vec(),
            model: file[m..a].to_vec(),
            optim: file[a..file.len() - 32].to_vec(),
            path,
        }
    })
}

fn small(c: &TrainConfig) -> bool {
    let m = &c.model;
    m.d_model <= 32 && m.n_layers <= 2 && m.d_ff <= 128 && m.context <= 64 && c.batch <= 8
}

fn load_and_restore(f: &Fixture, content: Vec<u8>) {
    let mut file = content;
    let trailer = *blake3::hash(&file).as_bytes();
    file.extend_from_slice(&trailer);
    std::fs::write(&f.path, &file).unwrap();
    let Ok(ck) = checkpoint::load(&f.path) else { return };
    if small(&ck.meta.config) {
        let _ = ck.into_trainer(&f.corpus);
    }
}

fn mutate(u: &mut Unstructured, bytes: &mut Vec<u8>) -> Result<()> {
    for _ in 0..u.int_in_range(0..=6u8)? {
        if bytes.is_empty() {
            break;
        }
        let at = u.int_in_range(0..=bytes.len() - 1)?;
        match u.int_in_range(0..=3u8)? {
            0 => bytes[at] = u.arbitrary()?,
            1 => bytes[at] ^= 1 << u.int_in_range(0..=7u8)?,
            2 => {
                let v = *u.choose(&[0u64, 1, 0xff, 0xffff_ffff, u64::MAX, 1 << 40])?;
                let end = (at + 8).min(bytes.len());
                bytes[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
            }
            _ => {
                let n = u.int_in_range(0..=bytes.len() - at)?;
                bytes.drain(at..at + n);
            }
        }
    }
    Ok(())
}

fn sections(u: &mut Unstructured, f: &Fixture) -> Result<()> {
    let mut meta = f.meta.clone();
    let mut model = f.model.clone();
    let mut optim = f.optim.clone();
    match u.int_in_range(0..=3u8)? {
        // Metadata JSON from the input (config, backend, shard, state, corpus hash).
        0 => {
            meta = {
                let n = u.int_in_range(0..=1024usize)?;
                u.bytes(n)?
            }
            .to_vec()
        }
        1 => mutate(u, &mut meta)?,
        2 => mutate(u, &mut model)?,
        _ => mutate(u, &mut optim)?,
    }
    if u.arbitrary()? {
        mutate(u, &mut model)?;
        mutate(u, &mut optim)?;
    }
    let mut lens = [meta.len() as u64, model.len() as u64, optim.len() as u64];
    if u.ratio(1, 8)? {
        // Length fields that lie (the total may still match the file).
        let i = u.int_in_range(0..=2usize)?;
        let j = (i + 1) % 3;
        let d = u.int_in_range(0..=lens[i])?;
        lens[i] -= d;
        lens[j] = lens[j].wrapping_add(d);
        if u.arbitrary()? {
            lens[j] = u.arbitrary()?;
        }
    }
    let version: u32 = if u.ratio(1, 16)? { u.arbitrary()? } else { checkpoint::FORMAT_VERSION };
    let mut content = Vec::with_capacity(HEADER_LEN + meta.len() + model.len() + optim.len());
    content.extend_from_slice(b"ATOLLCKP");
    content.extend_from_slice(&version.to_le_bytes());
    for l in lens {
        content.extend_from_slice(&l.to_le_bytes());
    }
    content.extend_from_slice(&meta);
    content.extend_from_slice(&model);
    content.extend_from_slice(&optim);
    load_and_restore(f, content);
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode & 1 == 0 {
        load_and_restore(f, rest.to_vec());
    } else {
        let _ = sections(&mut Unstructured::new(rest), f);
    }
});
