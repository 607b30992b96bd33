//! A fixed, fast hasher for maps keyed by content hashes and peer ids.
//!
//! The std hasher (SipHash with a random key) is built to resist hash flooding by chosen
//! keys. Our keys are blake3 outputs (already uniform) and peer ids (bounded per map), so a
//! multiply-mix is enough; being unkeyed also makes iteration order reproducible, although
//! nothing relies on it (every order that matters is sorted explicitly).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Fibonacci-mixes the written integers.
#[derive(Debug, Default, Clone, Copy)]
pub struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<MixHasher>>;
pub type FastSet<K> = HashSet<K, BuildHasherDefault<MixHasher>>;
